"""The ``cyto`` command line (``cyto.cli``): thin commands over the library.

One module per command group: ``train``, ``export`` (info, doctor, export), ``score`` (predict,
score, calibrate), ``review`` (review, refine), ``view``, ``synth`` (synth, demo), ``data``,
``eval`` and ``bench``; ``_app`` holds the app, its groups and the option types they share. A
command parses, calls one library function and prints; it may import any layer of cyto, nothing
imports it.
Heavy libraries (torch, onnxruntime, pyvips, numba, numpy-heavy modules) are imported inside the
command bodies, so ``cyto --help`` starts fast. Library errors become one line on stderr and a
non-zero exit code; ``CYTO_DEBUG=1`` shows the full traceback.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from contextlib import contextmanager, suppress

import typer

# isort: off
# the command modules register their commands on the app; this order is the order of `cyto --help`
from cyto.cli import train, export, score, calibrate, review, view, synth  # noqa: F401
from cyto.cli import data, eval, bench  # noqa: F401  (command groups)

# isort: on
from cyto.cli._app import app, guard_local_paths
from cyto.cli.train import METHOD_NAMES
from cyto.envvars import env_switch
from cyto.errors import CytoError

guard_local_paths(app)  # every Path argument of every command: a local path, never a URL

__all__ = ["METHOD_NAMES", "app", "main"]


@contextmanager
def _warnings_as_lines():
    """cyto's own warnings print as one ``warning: ...`` line (others as Python prints them),
    every one: a command's lines are its output. (They point past cyto's frames,
    :func:`cyto.errors.warn_caller`, which from the command line is the CLI library's one
    line: Python's "once per location" would keep a second command in one process, a test's,
    from saying what the first said.)"""
    import warnings

    from cyto.errors import CytoWarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, CytoWarning):
            print(f"warning: {message}", file=file or sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    with warnings.catch_warnings():
        shown = warnings.showwarning
        warnings.showwarning = show
        warnings.filterwarnings("always", category=CytoWarning)
        yield


def _shown_names(exc: UnicodeError) -> tuple[str, int]:
    """The error handler of stdout and stderr: a file name that is not UTF-8 (Python holds
    its bytes as surrogate escapes) is written ``slide-\\xff.tif``, as in cyto's tables."""
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    bad = exc.object[exc.start : exc.end]
    shown = "".join(
        f"\\x{ord(c) - 0xDC00:02x}"
        if 0xDC80 <= ord(c) <= 0xDCFF
        else c.encode("ascii", "backslashreplace").decode("ascii")
        for c in bad
    )
    return shown, exc.end


def _names_shown() -> None:
    """Messages never fail on a file name that is not UTF-8: a strict locale would raise on it,
    Python's C locale writes its raw bytes (which a pipe that reads UTF-8 fails on); a text an
    ASCII terminal cannot show is written with ``\\u`` escapes."""
    import codecs

    codecs.register_error("cyto-names", _shown_names)
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):  # not a test's StringIO
            stream.reconfigure(errors="cyto-names")


class _Console:
    """stdout or stderr whose reader may go (``cyto score ... | head``): the first write that
    finds the pipe closed points the stream at the null device, and the work goes on. A closed
    console is never an error of the command's own outputs, nor a reason to stop halfway."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def __getattr__(self, name):
        return getattr(self._stream, name)

    def _gone(self) -> None:
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, self._stream.fileno())  # this process's later writes, C's too
        finally:
            os.close(null)
        with suppress(OSError):
            self._stream.flush()  # what was buffered goes to the null device

    def write(self, text):
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._gone()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._gone()


def _console_may_close() -> None:
    """Route stdout and stderr through :class:`_Console` (a test's StringIO is left as it is)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        try:
            stream.fileno()
        except (AttributeError, OSError, ValueError):
            continue
        if not isinstance(stream, _Console):
            setattr(sys, name, _Console(stream))


def _argument_given_as_flag(argv: list[str]) -> str | None:
    """One line for ``--NAME VALUE`` given to a command that takes NAME as an argument
    (``cyto predict CELLS --model M``, as ``cyto score`` takes it): click said "No such option:
    --model (Possible options: --help)". Which argument, and the command's usage; or, for an
    option of the Python API only (``--chunk-cells``, :data:`cyto.flags.FLAGS` None), that it
    is one (click offered ``--burden-cells``). None when every flag is the command's own (or
    no command is named). Typer carries a click of its own:
    its classes are read from the app, not imported."""
    if not any(a.startswith("--") for a in argv):
        return None
    cmd = typer.main.get_command(app)
    path, rest = ["cyto"], list(argv)
    while hasattr(cmd, "list_commands") and rest and not rest[0].startswith("-"):  # a group
        cmd = cmd.get_command(cmd.context_class(cmd), rest[0])
        if cmd is None:
            return None
        path.append(rest.pop(0))
    if hasattr(cmd, "list_commands"):
        return None
    from cyto.flags import FLAGS

    own = {o for p in cmd.params for o in (*p.opts, *getattr(p, "secondary_opts", ()))}
    arguments = {p.name: p for p in cmd.params if p.param_type_name == "argument"}
    for a in rest:
        flag = a.split("=")[0]
        if not flag.startswith("--") or flag in own:
            continue
        field = flag[2:].replace("-", "_")
        if field in arguments:
            usage = " ".join(cmd.collect_usage_pieces(cmd.context_class(cmd)))
            return (
                f"{' '.join(path)} takes {field} as an argument, not {flag}: usage "
                f"{' '.join(path)} {usage}"
            )
        if field in FLAGS and FLAGS[field] is None:  # click offered a flag of another name
            return (
                f"{flag} is no flag of {' '.join(path)}: {field}= is an option of cyto's Python "
                "API only (docs/reference/api.md)"
            )
    return None


@functools.cache
def _click_app():
    """The click command Typer makes of the app (what ``app()`` makes anew at each call: a
    tenth of a second, again for each command run in one process: a script, the tests)."""
    return typer.main.get_command(app)


#: what a user may type as a command that is an option of another command
AS_OPTIONS = {"watch": "an option of cyto score: cyto score FOLDER --model MODEL --out OUT --watch"}


def _run_app() -> None:
    """The app as click's standalone mode runs it, but a usage error is said in cyto's words:
    click's usage and hint, then ``error: MESSAGE`` as every other refusal of cyto (click wrote
    ``Error: MESSAGE``, hostile rounds 28 and 29). Typer carries a click of its own in some
    versions: the exception classes are read from Typer's ``BadParameter``, not imported."""
    import io

    usage_error = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
    try:
        code = _click_app()(standalone_mode=False, prog_name="cyto")
    except usage_error as exc:
        shown = io.StringIO()
        exc.show(file=shown)
        text = re.sub(r"(?m)^Error: ", "error: ", shown.getvalue())
        if exc.exit_code == 2 and (words := _argument_given_as_flag(sys.argv[1:])):
            # click's line named no argument ("No such option: --model"): say which one it is
            text = re.sub(r"(?ms)^error: .*", lambda _m: f"error: {words}\n", text)
        asked = next((a for a in sys.argv[1:] if not a.startswith("-")), None)
        if exc.exit_code == 2 and asked in AS_OPTIONS and "No such command" in text:
            # a command that is an option of another: said which (round 76, 11)
            text = text.rstrip("\n").rstrip(".") + f": {asked} is {AS_OPTIONS[asked]}\n"
        sys.stderr.write(text if text.endswith("\n") else text + "\n")
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.stderr.write("Aborted!\n")
        sys.exit(1)
    if code == 130:  # a Ctrl-C, which Typer turns into Exit(130): said as main() says one
        raise KeyboardInterrupt  # (it ended silently in a slide's plan, hostile round 30, 16)
    if isinstance(code, int) and code:  # an Exit(code) raised by a command
        sys.exit(code)


def main() -> None:
    """Entry point: run the app, turning library errors into one line and an exit code. A Ctrl-C
    exits with 130, also one that something swallowed on its way (:mod:`cyto.interrupts`)."""
    import cyto.interrupts as interrupts

    _names_shown()
    _console_may_close()
    interrupts.install()
    try:
        try:
            from cyto.envvars import check_switches

            check_switches()
            with _warnings_as_lines():
                _run_app()
        except SystemExit as exc:
            if exc.code not in (0, None):
                raise
        interrupts.check()  # the command finished, but a Ctrl-C came and was swallowed
        interrupts.closing()  # a stop from here on comes while Python closes: said as such
    except CytoError as exc:
        if env_switch("CYTO_DEBUG"):
            raise
        from cyto.location import urls_for_staging

        typer.secho(f"error: {urls_for_staging(str(exc))}", err=True, fg=typer.colors.RED)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:  # a Ctrl-C, a service manager's SIGTERM, a closed terminal's
        typer.secho(interrupts.stop_words(), err=True)  # SIGHUP: said and exited as each
        sys.exit(interrupts.stop_code())
    except OSError as exc:  # the machine's (a full disk, a read-only folder), said in one line
        from cyto.errors import system_words

        words = system_words(exc)
        if words is None or env_switch("CYTO_DEBUG"):
            raise
        typer.secho(f"error: {words}", err=True, fg=typer.colors.RED)
        sys.exit(1)


if __name__ == "__main__":
    main()
