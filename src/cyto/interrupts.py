"""Ctrl-C that is never lost and never prints a worker's traceback.

Two ways a Ctrl-C went wrong before (``cyto score`` with workers, a terminal's SIGINT to the
whole process group):

- **Swallowed.** Python raises KeyboardInterrupt wherever the main thread happens to be. Inside
  a callback from C (llvmlite calls one while numba compiles a kernel) the exception is printed
  as "Exception ignored" and dropped, and the run went on to the end with exit status 0.
  :func:`install` puts a handler in place that also records the Ctrl-C; :func:`check`, called
  on every progress step and when a command returns, raises it again if it was swallowed. The
  "Exception ignored" traceback of such a swallowed Ctrl-C is not printed.
- **Workers starting up.** A spawned worker imports its modules before the pool's initializer
  can make it ignore SIGINT; a Ctrl-C in that window killed it with a KeyboardInterrupt
  traceback. :func:`spawn_pool` starts workers with SIGINT blocked (a child inherits the signal
  mask of the thread that starts it); a worker ignores SIGINT, then unblocks it, before its own
  initializer runs. The main process alone handles Ctrl-C. CPython's resource tracker is
  started the same way.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager

_SIGINT = {signal.SIGINT}
_pending = False
_terminated = False
_late = 0  # the exit code of a stop that came while a finished command's Python closed


def _on_sigint(signum, frame) -> None:
    global _pending
    _pending = True
    raise KeyboardInterrupt


#: the stops cyto takes as a Ctrl-C is taken, besides SIGINT: a service manager's SIGTERM and
#: the SIGHUP of a terminal or SSH session that closed (it killed ``cyto view`` where it stood,
#: its remote slide's fetched blocks left on disk: hostile round 55, 2)
_STOPS = (signal.SIGTERM, *((signal.SIGHUP,) if hasattr(signal, "SIGHUP") else ()))
#: the signal that stopped the run, where not a Ctrl-C
_stopped_by: int | None = None


def _on_sigterm(signum, frame) -> None:
    """SIGTERM (a service manager's stop: systemd, ``docker stop``, a batch scheduler), or the
    SIGHUP of a closed terminal, stops as a Ctrl-C does: finished chunks kept, workers stopped,
    what was done said. It killed the process where it stood, a watch saying nothing (hostile
    round 37, 5)."""
    global _pending, _terminated, _stopped_by
    if _terminated:  # a second stop while the first stops the run: it is under way (raised
        return  # inside the stop, it printed an "Exception ignored" traceback: round 38, 2)
    _pending = _terminated = True
    _stopped_by = signum
    raise KeyboardInterrupt


def terminated() -> bool:
    """Whether the stop that came was a SIGTERM or SIGHUP (exit 143, 129), not a Ctrl-C."""
    return _terminated


def _stop_signal() -> int:
    """The signal of the stop that came: SIGINT for a Ctrl-C, else the one recorded."""
    return (_stopped_by or signal.SIGTERM) if _terminated else signal.SIGINT


def stop_code(signum: int | None = None) -> int:
    """The exit code of a stop by ``signum`` (default: the one that came): 128 + the signal's
    number, as a shell reads a death by it (130 a Ctrl-C, 143 SIGTERM, 129 SIGHUP)."""
    return 128 + int(signum or _stop_signal())


def stop_words(signum: int | None = None) -> str:
    """The one line a command stopped by ``signum`` (default: the one that came) ends with:
    ``interrupted`` (a Ctrl-C), else ``stopped (SIGTERM)`` or ``stopped (SIGHUP)``."""
    signum = signum or _stop_signal()
    return "interrupted" if signum == signal.SIGINT else f"stopped ({signal.Signals(signum).name})"


def install() -> bool:
    """Record every Ctrl-C and SIGTERM from now on (the main thread of a command line program
    calls this). A SIGINT that is ignored (a shell's background job) or handled by someone else
    stays so; so does a SIGTERM."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if not _late_exit_registered:  # registered first, so it runs after every other atexit
        _register_late_exit()
    for sig in _STOPS:
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, _on_sigterm)
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return False
    signal.signal(signal.SIGINT, _on_sigint)
    if getattr(sys.unraisablehook, "__wrapped__", None) is None:
        sys.unraisablehook = _quiet_when_recorded(sys.unraisablehook)
    return True


_late_exit_registered = False


def _register_late_exit() -> None:
    global _late_exit_registered
    _late_exit_registered = True
    atexit.register(_exit_late)


def _exit_late() -> None:
    """The last thing Python does at exit before it frees its modules (and resets the signal
    handlers it set to the default, which dies of the signal with no word): a stop that came
    while a finished command's Python closed exits with its code (130, or 143 for SIGTERM)
    rather than 0; otherwise a stop from here on is ignored, the command's outputs complete.
    Nothing changes for a process whose handlers are no longer cyto's (a test runner)."""
    if _late:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_late)
    for sig in (signal.SIGINT, *_STOPS):  # left as they are by Python's freeing
        if signal.getsignal(sig) is _while_closing:
            signal.signal(sig, signal.SIG_IGN)


def closing() -> None:
    """The command has finished, its outputs complete; Python closes (joins threads and pools'
    processes, runs what waits for exit, frees modules). A Ctrl-C or SIGTERM from now on is
    said in one line and the exit code is the stop's, once Python has closed: it died of the
    signal with no word before (hostile round 47, 7). A second one ends it at once."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGINT, *_STOPS):
        if signal.getsignal(sig) in (_on_sigint, _on_sigterm):
            signal.signal(sig, _while_closing)


def _while_closing(signum, frame) -> None:
    global _late
    code = stop_code(signum)
    if _late:
        os._exit(_late)
    _late = code
    what = stop_words(signum)
    sys.stderr.write(f"{what} while closing: the command had finished; what it wrote is complete\n")
    sys.stderr.flush()


def _quiet_when_recorded(hook):
    """Python reports an exception it has to drop (in a callback from C, a ``__del__``) through
    ``sys.unraisablehook``; a Ctrl-C dropped so is recorded, and raised at the next
    :func:`check`, so its traceback is noise. Everything else goes to ``hook``."""

    def quiet(unraisable) -> None:
        if _pending and unraisable.exc_type is KeyboardInterrupt:
            return
        hook(unraisable)

    quiet.__wrapped__ = hook
    return quiet


def forget_broken_imports() -> list[str]:
    """Drop from ``sys.modules`` the submodules of packages that are not there themselves: what
    an import stopped half-way (Ctrl-C in a notebook while numba loaded) leaves behind. Python
    drops the package whose import failed but keeps its finished submodules, and the next
    import of the package then lacks them as attributes (``module 'numba' has no attribute
    'core'`` at every later call, until a restart: hostile round 56, 1); dropped, they are
    imported again with it. Returns the names dropped."""
    orphans = [
        name
        for name in list(sys.modules)
        if "." in name and name.split(".", 1)[0] not in sys.modules
    ]
    for name in orphans:
        sys.modules.pop(name, None)
    return orphans


def check() -> None:
    """Raise KeyboardInterrupt if a Ctrl-C came since the last check: one swallowed on its way,
    or one that code caught and went on from. Once per Ctrl-C in the main thread: a Ctrl-C
    means stop. A helper thread (the threshold thread that opens a slide, a --download's
    progress in it) is stopped too, but leaves the Ctrl-C to the main thread: one it took
    was lost there, where a C callback had swallowed it (hostile round 62, 3)."""
    global _pending
    if _pending:
        if threading.current_thread() is threading.main_thread():
            _pending = False
        raise KeyboardInterrupt


@contextmanager
def sigint_blocked():
    """SIGINT blocked in the calling thread: processes and threads started here inherit the
    block; a Ctrl-C that comes meanwhile waits, and is delivered when this ends."""
    if not hasattr(signal, "pthread_sigmask"):  # Windows: no signal masks
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGINT)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def die_with_parent(parent: int) -> bool:
    """Linux: have the kernel kill this process when ``parent`` dies (``PR_SET_PDEATHSIG``).
    A SIGKILL of ``cyto score`` used to leave its workers running under PID 1 for good, each
    holding its memory. The signal is tied to the thread that started this process: pools are
    fed from the caller's thread (spawn_pool). Returns whether it is armed; a parent already
    gone by then ends this process at once."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        armed = libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) == 0  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:  # the parent died before the prctl: nobody will signal
        os._exit(1)
    return armed


def _start_worker(initializer, initargs, parent: int | None = None) -> None:
    if parent is not None:
        die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # discards a Ctrl-C that waited meanwhile
    # a service manager's SIGTERM goes to every process of the service: the main process stops
    # the workers (and they die with it); one dying first broke the pool, said as a failure
    for sig in _STOPS:  # a closed terminal's SIGHUP goes to the whole group as well
        signal.signal(sig, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGINT)
    if initializer is not None:
        initializer(*initargs)


class _Pool(ProcessPoolExecutor):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        _lock_wakeup(self._executor_manager_thread_wakeup)

    # a worker process (and the pool's own threads) start inside submit
    def submit(self, fn, /, *args, **kwargs):
        with sigint_blocked():
            return super().submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """As ProcessPoolExecutor's, but a ``shutdown(wait=True)`` after a
        ``shutdown(wait=False)`` (tell the workers to stop now, wait for them later) waits for
        them: the executor forgets its processes at its first shutdown."""
        known = self.__dict__.setdefault("_cyto_processes", [])
        known.extend(p for p in (self._processes or {}).values() if p not in known)
        manager = self._executor_manager_thread  # it joins the processes, then ends
        if manager is not None:
            self.__dict__["_cyto_manager"] = manager
        super().shutdown(wait=wait, cancel_futures=cancel_futures)
        if wait:
            for process in known:
                process.join()
            if self.__dict__.get("_cyto_manager") is not None:
                self.__dict__["_cyto_manager"].join()


def _lock_wakeup(wakeup) -> None:
    """Python 3.11's pool wakes its manager thread at exit (``_python_exit``) through a pipe that
    the thread may be closing meanwhile (a pool told to stop without waiting, as a failed slide's
    is): the write met a closed pipe and Python printed an "Exception ignored ... Bad file
    descriptor" traceback after cyto's one-line error (hostile round 35, 2). Waking and closing
    are made one at a time, as Python 3.12 makes them (its ``_ThreadWakeup`` has a lock)."""
    if hasattr(wakeup, "_lock"):  # Python 3.12 and later
        return
    lock = threading.Lock()
    close, wake = wakeup.close, wakeup.wakeup

    def locked_close() -> None:
        with lock:
            close()

    def locked_wakeup() -> None:
        with lock:
            wake()

    wakeup.close, wakeup.wakeup = locked_close, locked_wakeup


def spawn_pool(workers: int, initializer=None, initargs: tuple = ()) -> ProcessPoolExecutor:
    """A pool of ``workers`` spawned processes (no fork of a process that may hold threads) that
    leave Ctrl-C to the main process, from the moment each starts, and die with it (Linux).
    Refused, before any process starts, when a public Python call runs from the top level of a
    script outside ``if __name__ == "__main__":`` (:func:`unguarded_script`)."""
    import multiprocessing as mp

    refuse_unguarded()
    _start_resource_tracker()
    return _Pool(
        workers,
        mp_context=mp.get_context("spawn"),
        initializer=_start_worker,
        initargs=(initializer, initargs, os.getpid()),
    )


def _start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker (the helper process every spawned pool uses)
    ignoring SIGHUP, as it ignores SIGINT and SIGTERM itself: a closed terminal's SIGHUP,
    sent to the whole process group, killed it, and it printed tracebacks as it came back
    (a handler is not inherited across exec; SIG_IGN is)."""
    from multiprocessing import resource_tracker

    hup = getattr(signal, "SIGHUP", None)
    if hup is None or threading.current_thread() is not threading.main_thread():
        resource_tracker.ensure_running()
        return
    before = signal.signal(hup, signal.SIG_IGN)
    try:
        resource_tracker.ensure_running()
    finally:
        signal.signal(hup, before)


def refuse_unguarded() -> None:
    """Refused in one line, before any worker process starts: a public Python call run from the
    top level of a script outside ``if __name__ == "__main__":`` (:func:`unguarded_script`),
    or from a script read from standard input, which no worker can import again. Called where
    a pool starts, and by a public call that may start one (``synth_slide``, whose pool starts
    only for a larger slide: a script tried on a small slide failed once the slide grew; round
    29, 12)."""
    from cyto.flags import passing, python_call

    call, where = python_call(), unguarded_script()
    if call and where:
        from cyto.errors import ConfigError

        raise ConfigError(
            f"{call} starts worker processes, and each runs your script {where[0]} again from "
            f"its top (Python's spawn): call {call} under 'if __name__ == \"__main__\":' "
            f"(line {where[1]} is outside it), or pass {passing('workers', 0)}"
        )
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    if main and not os.path.isfile(main):  # python - < script.py: '<stdin>' (round 28, 3)
        from cyto.errors import ConfigError

        what = f"{call} starts" if call else "this starts"
        raise ConfigError(
            f"{what} worker processes, and each runs the main script again from its file, "
            f"which a script read from {main} has not: save it as a .py file and run that, or "
            f"pass {passing('workers', 0)}"
        )


def unguarded_script() -> tuple[str, int] | None:
    """The script file and line from which the top level of ``__main__``, outside an ``if
    __name__ == "__main__":`` block, called the code running now (None: no such caller). A
    spawned worker imports ``__main__`` again, so such a call runs once more in every worker
    and fails there, where only a broken worker is seen."""
    import ast
    from pathlib import Path

    file = getattr(sys.modules.get("__main__"), "__file__", None)
    if not file or not str(file).endswith(".py"):
        return None  # an interpreter, a notebook, python -c: nothing is imported again
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__main__":
            break
        frame = frame.f_back
    if frame is None:
        return None
    line = frame.f_lineno
    try:
        tree = ast.parse(Path(file).read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        guard = isinstance(node, ast.If) and _main_test(node.test)
        if guard and node.lineno <= line <= (node.end_lineno or node.lineno):
            return None
    return str(file), line


def _main_test(test) -> bool:
    """``__name__ == "__main__"`` (either way round)."""
    import ast

    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return False
    if not isinstance(test.ops[0], ast.Eq):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s.id for s in sides if isinstance(s, ast.Name)]
    words = [s.value for s in sides if isinstance(s, ast.Constant)]
    return names == ["__name__"] and words == ["__main__"]
