"""Progress bars for long work: rich on a terminal, sparse log lines elsewhere (CI, pipes)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import cyto.interrupts as interrupts
from cyto.envvars import env_switch

#: set for the length of a Python call with ``echo=None`` (:func:`quiet`): no bars
_QUIET: ContextVar[bool] = ContextVar("cyto_progress_quiet", default=False)


@contextmanager
def quiet(on: bool = True) -> Iterator[None]:
    """No progress bars in this thread while the block runs (``on``), as ``CYTO_PROGRESS=0``
    for the whole process: a Python call given ``echo=None`` says nothing, bars included."""
    token = _QUIET.set(_QUIET.get() or on)
    try:
        yield
    finally:
        _QUIET.reset(token)


#: set for the length of a Python call given its own ``echo`` (:func:`through`): progress is
#: said in lines through it
_ECHO: ContextVar[Callable[[str], object] | None] = ContextVar("cyto_progress_echo", default=None)


@contextmanager
def through(echo: Callable[[str], object] | None) -> Iterator[None]:
    """Progress in this thread while the block runs is said as lines through ``echo`` (a Python
    call given its own, a logger's method): it went to stderr, past the caller's ``echo``, so a
    notebook that logs a call's lines saw none of its progress (hostile round 56, 6). None: as
    before (a bar on a terminal, lines on stderr elsewhere)."""
    token = _ECHO.set(echo or _ECHO.get())
    try:
        yield
    finally:
        _ECHO.reset(token)


class _Bar:
    def __init__(self, advance_fn, set_postfix_fn) -> None:
        self._advance = advance_fn
        self._postfix = set_postfix_fn

    def advance(self, n: float = 1) -> None:
        interrupts.check()  # each step of long work: a Ctrl-C swallowed on the way stops it
        self._advance(n)

    def set_postfix(self, text: str) -> None:
        self._postfix(text)


def _amount(x: float) -> str:
    """A count as a log line says it: whole as it is, else to one decimal (``0.4/0.4 MiB``,
    never ``0.417671``)."""
    return f"{x:g}" if float(x).is_integer() else f"{x:.1f}"


@contextmanager
def progress(
    description: str, total: float | None, unit: str = "items", done: float = 0
) -> Iterator[_Bar]:
    """A progress bar with rate and ETA.

    On a terminal this is a rich bar; otherwise (CI, redirected output) it prints a line about
    every 10 s, so logs stay readable. ``CYTO_PROGRESS=0`` silences it. ``done``: the part an
    earlier run finished (a resumed run): counted, but not in this run's rate and ETA.
    """
    if not env_switch("CYTO_PROGRESS") or _QUIET.get():
        yield _Bar(lambda n: None, lambda t: None)
        return
    echo = _ECHO.get()
    if echo is None and sys.stderr.isatty():
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        columns = [
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[postfix]}"),
        ]
        with Progress(*columns, transient=False) as prog:
            task = prog.add_task(description, total=total, completed=done, rate="", postfix="")
            start = time.perf_counter()
            here = [0.0]

            def adv(n: float) -> None:
                here[0] += n
                rate = here[0] / max(time.perf_counter() - start, 1e-9)
                prog.update(task, advance=n, rate=f"{rate:,.1f} {unit}/s")

            yield _Bar(adv, lambda t: prog.update(task, postfix=t))
        return

    start = last = time.perf_counter()
    state = {"done": float(done), "postfix": ""}
    said: list[tuple[float, str]] = []  # the count and postfix of the last line printed

    def line(now: float) -> None:
        said[:] = [(state["done"], state["postfix"])]
        rate = (state["done"] - done) / max(now - start, 1e-9)
        of = f"/{_amount(total)}" if total is not None else ""
        eta = ""
        if total is not None and rate > 0:
            eta = f", eta {max(total - state['done'], 0) / rate:,.0f} s"
        text = (
            f"{description}: {_amount(state['done'])}{of} {unit} ({rate:,.1f} {unit}/s{eta})"
            f" {state['postfix']}".rstrip()
        )
        if echo is None:
            print(text, file=sys.stderr, flush=True)
        else:
            echo(text)

    def adv_plain(n: float) -> None:
        nonlocal last
        state["done"] += n
        now = time.perf_counter()
        if now - last >= 10:
            last = now
            line(now)

    yield _Bar(adv_plain, lambda t: state.update(postfix=t))
    # the last line when the work ends, with what was said after the last step (the cells of a
    # slide's last tiles are counted once they are scored)
    # (once: the last step's own line, printed just before, said it already: hostile round 40)
    if (state["done"] or state["postfix"]) and said != [(state["done"], state["postfix"])]:
        line(time.perf_counter())
