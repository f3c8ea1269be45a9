"""``cyto ARGS`` as the tests run it: in this process by default, in a process of its own when
the behaviour under test belongs to a process.

A command run here goes through :func:`cyto.cli.main` exactly as ``python -m cyto`` does (argument
parsing, one-line errors, exit codes), with stdout and stderr captured and an uncaught exception
turned into a printed traceback and exit code 1, as Python would. What a command may change in
this process is put back afterwards: the environment, ``sys.argv``, the SIGINT handler and the
unraisable hook (:func:`cyto.interrupts.install`), torch's thread count. Starting a Python with
torch, ONNX Runtime and numba costs about two seconds, and the suite runs about a hundred commands.

A process of its own (``process=True``, and always with ``unset``, with environment variables that
act when modules are imported, or with ``--ray``): peak memory, signals, what ``--help`` imports,
a missing package, a Ray cluster.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import traceback
from contextlib import redirect_stderr, redirect_stdout

# read by cyto (and by click and rich for the terminal width) at call time, so they act the
# same in this process
IN_PROCESS_ENV = {"CYTO_DEBUG", "CYTO_PROGRESS", "COLUMNS"}


def run_cyto(
    *args: str,
    env: dict | None = None,
    unset: tuple[str, ...] = (),
    process: bool = False,
    timeout: float = 300,
) -> subprocess.CompletedProcess:
    """``cyto ARGS`` with ``env`` added to this environment less ``unset`` (``timeout``: seconds
    a process of its own may take; an emulated CPU, ``tests/isa_mask``, takes longer)."""
    env = {"CYTO_PROGRESS": "0", **(env or {})}
    if process or unset or set(env) - IN_PROCESS_ENV or "--ray" in args:
        full_env = {**os.environ, **env}
        for name in unset:
            full_env.pop(name, None)
        return subprocess.run(
            [sys.executable, "-m", "cyto", *args],
            capture_output=True,
            text=True,
            env=full_env,
            timeout=timeout,
        )
    return _in_process(list(args), env)


def _in_process(args: list[str], env: dict) -> subprocess.CompletedProcess:
    from cyto import cli, interrupts

    saved_env, saved_argv = dict(os.environ), sys.argv
    saved_sigint, saved_hook = signal.getsignal(signal.SIGINT), sys.unraisablehook
    saved_sigterm = signal.getsignal(signal.SIGTERM)
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else None
    out, err = io.StringIO(), io.StringIO()
    os.environ.update(env)
    sys.argv = ["cyto", *args]
    code = 0
    try:
        with redirect_stdout(out), redirect_stderr(err):
            try:
                cli.main()
            except SystemExit as exc:
                if exc.code is None or isinstance(exc.code, int):
                    code = exc.code or 0
                else:  # sys.exit("message"): Python prints it and exits 1
                    print(exc.code, file=sys.stderr)
                    code = 1
            except BaseException:  # what Python prints when a program dies of an exception
                traceback.print_exc()
                code = 1
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        sys.argv = saved_argv
        signal.signal(signal.SIGINT, saved_sigint)
        signal.signal(signal.SIGTERM, saved_sigterm)
        sys.unraisablehook = saved_hook
        interrupts._pending = interrupts._terminated = False
        interrupts._late = 0
        torch = sys.modules.get("torch")
        if torch is not None and threads is not None and torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
    return subprocess.CompletedProcess(["cyto", *args], code, out.getvalue(), err.getvalue())


def leaf_commands() -> list[tuple[list[str], object]]:
    """(path, command) of every command of the ``cyto`` app that is no group (``["data",
    "cells"]``), read from the app itself: a command added later is walked too. Typer carries a
    click of its own: a group is what has ``commands``."""
    import typer

    from cyto.cli import app

    found: list[tuple[list[str], object]] = []

    def walk(cmd, path: list[str]) -> None:
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                walk(sub, [*path, name])
        else:
            found.append((path, cmd))

    walk(typer.main.get_command(app), [])
    return found
