"""Ctrl-C is never lost and never prints a worker's traceback (:mod:`cyto.interrupts`)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from cyto.interrupts import spawn_pool

# a Ctrl-C that arrives while Python runs a callback from C: the KeyboardInterrupt is printed
# as "Exception ignored" and dropped (llvmlite calls such a callback while numba compiles)
SWALLOW = """
import ctypes, os, signal, sys
from cyto import interrupts

@ctypes.CFUNCTYPE(None)
def callback():
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(100000):
        pass

signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
"""


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SWALLOW + code)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_swallowed_ctrl_c_stops_the_next_step_of_long_work():
    r = _run(
        """
from cyto.progress import progress
assert interrupts.install()
callback()
print("callback returned", flush=True)
with progress("work", total=3) as bar:
    bar.advance()
    print("went on", flush=True)
"""
    )
    assert "callback returned" in r.stdout  # the callback did swallow the KeyboardInterrupt
    assert "Exception ignored" not in r.stderr  # the dropped one is not printed...
    assert "went on" not in r.stdout, r.stdout  # ...but raised at the next step
    assert r.returncode != 0 and r.stderr.rstrip().endswith("KeyboardInterrupt"), r.stderr
    assert r.stderr.count("Traceback") == 1


def test_other_exceptions_dropped_in_callbacks_are_still_printed():
    r = _run(
        """
assert interrupts.install()

@ctypes.CFUNCTYPE(None)
def broken():
    raise ValueError("a real fault")

broken()
print("done", flush=True)
"""
    )
    assert r.returncode == 0 and "done" in r.stdout
    assert "Exception ignored" in r.stderr and "a real fault" in r.stderr, r.stderr


def test_a_command_that_finishes_after_a_swallowed_ctrl_c_exits_130():
    r = _run(
        """
import cyto.cli
def app(**_how):  # as cyto.cli runs its app's click command: standalone_mode, prog_name
    callback()
    print("command done", flush=True)
    sys.exit(0)
cyto.cli._click_app = lambda: app
cyto.cli.main()
"""
    )
    assert "command done" in r.stdout
    assert r.returncode == 130, (r.returncode, r.stderr)
    assert r.stderr.rstrip().endswith("interrupted")


def test_a_ctrl_c_caught_and_gone_on_from_stops_the_next_step_once():
    r = _run(
        """
assert interrupts.install()
try:
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(100000):
        pass
except KeyboardInterrupt:
    print("raised", flush=True)  # and the program goes on, as if nothing had come
try:
    interrupts.check()
except KeyboardInterrupt:
    print("stopped at the next step", flush=True)
interrupts.check()
print("once", flush=True)
"""
    )
    assert r.stdout.split("\n")[:3] == ["raised", "stopped at the next step", "once"], r


def test_ignored_ctrl_c_stays_ignored():
    r = _run(
        """
signal.signal(signal.SIGINT, signal.SIG_IGN)  # a shell's background job
assert not interrupts.install()
assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
print("ok")
"""
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r


def test_a_worker_that_gets_ctrl_c_while_it_starts_lives_and_stays_quiet(capfd, monkeypatch):
    from tests import _slow_start

    monkeypatch.setenv("CYTO_TEST_SLOW_START", "2.0")  # the worker's import of it: 2 s
    # children of a shell's background job start with SIGINT ignored; a terminal's do not
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    pool = spawn_pool(1, _slow_start.ready)
    try:
        job = pool.submit(os.getpid)  # starts the worker, which imports _slow_start
        signal.signal(signal.SIGINT, before)
        (child,) = mp.active_children()
        time.sleep(1.0)
        assert child.is_alive()
        os.kill(child.pid, signal.SIGINT)  # a Ctrl-C while it starts
        assert job.result(timeout=60) == child.pid
        os.kill(child.pid, signal.SIGINT)  # and one while it is idle
        time.sleep(0.5)
        assert pool.submit(os.getpid).result(timeout=60) == child.pid
    finally:
        signal.signal(signal.SIGINT, before)
        pool.shutdown()
    assert "Traceback" not in capfd.readouterr().err


def test_a_pool_told_to_stop_early_is_waited_for_later():
    """The tile workers are told to stop when the last tile comes in (``shutdown(wait=False)``)
    and waited for after the summary (``shutdown(wait=True)``); ProcessPoolExecutor forgets its
    processes at the first call, so the second waited for nothing and a worker outlived
    ``score_slide``."""
    pool = spawn_pool(1)
    pool.submit(time.sleep, 1.0)
    before = {p.pid for p in mp.active_children()}
    assert before  # the worker started inside submit
    pool.shutdown(wait=False)
    pool.shutdown(wait=True)
    assert not {p.pid for p in mp.active_children()} & before


def test_a_ctrl_c_inside_a_command_ends_with_a_line_and_130(exported_dsvdd, tmp_path, monkeypatch):
    """Typer turns a Ctrl-C inside a command into exit 130 with nothing said: a `cyto score`
    stopped in its slide's plan, or while writing its outputs, ended silently (hostile round
    30, 16). It ends as every interrupted command does: `interrupted`, exit status 130."""
    import cyto.cohort.run as run
    from tests.cli_runner import run_cyto

    def stopped(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(run, "run_cohort", stopped)
    slide = tmp_path / "s.tif"
    slide.write_bytes(b"II*\x00" + bytes(64))
    out = tmp_path / "o"
    proc = run_cyto("score", str(slide), "--model", str(exported_dsvdd), "--out", str(out))
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.rstrip().splitlines()[-1] == "interrupted"


def test_a_pool_closing_its_wakeup_waits_for_a_wakeup_under_way():
    """Hostile round 35 (2): a slide that failed told its pool to stop without waiting; at exit
    Python woke the pool's manager thread through a pipe the thread was closing meanwhile, and
    printed an "Exception ignored ... Bad file descriptor" traceback after cyto's one line.
    The race, made certain: the close comes while a wakeup is writing, and waits for it."""
    import threading

    pool = spawn_pool(1)
    try:
        wakeup = pool._executor_manager_thread_wakeup
        writer = wakeup._writer
        real_send = writer.send_bytes
        closer = threading.Thread(target=wakeup.close)

        def send_while_closed(buf):
            closer.start()
            closer.join(0.3)  # a close that does not wait for this write closes the pipe now
            real_send(buf)

        writer.send_bytes = send_while_closed
        wakeup.wakeup()  # raised OSError (the pipe closed under it) before
        closer.join()
        assert wakeup._closed
        wakeup.wakeup()  # and after the close, a wakeup is nothing
    finally:
        pool.shutdown(wait=True)


def test_a_second_sigterm_while_the_first_stops_the_run_is_nothing(monkeypatch):
    """Hostile round 38 (2): a second SIGTERM during the stop raised inside it and printed an
    "Exception ignored ... KeyboardInterrupt" traceback."""
    import signal

    from cyto import interrupts

    monkeypatch.setattr(interrupts, "_terminated", False)
    monkeypatch.setattr(interrupts, "_pending", False)
    try:
        interrupts._on_sigterm(signal.SIGTERM, None)
    except KeyboardInterrupt:
        pass
    else:  # pragma: no cover - the test fails here
        raise AssertionError("the first SIGTERM did not stop the run")
    assert interrupts.terminated()
    try:  # the stop is under way: nothing more
        interrupts._on_sigterm(signal.SIGTERM, None)
    except KeyboardInterrupt:
        raise AssertionError("a second SIGTERM raised inside the stop") from None


# a command that finished, then a Python that takes its time to close (joining a thread, as it
# joins a pool's, freeing modules): a Ctrl-C or SIGTERM that comes meanwhile (hostile round 47, 7)
CLOSING = """
import threading
import cyto.cli
def app(**_how):
    print("command done", flush=True)
    sys.exit(0)
cyto.cli._click_app = lambda: app
threading.Thread(target=time.sleep, args=(SECONDS,)).start()  # Python joins it when closing
cyto.cli.main()
import time

import pytest
for sig in SIGNALS:
    os.kill(os.getpid(), sig)
    time.sleep(0.2)
"""


def _closing(seconds: float, *signals: int) -> tuple[subprocess.CompletedProcess, float]:
    code = CLOSING.replace("SECONDS", str(seconds)).replace(
        "SIGNALS", repr([int(s) for s in signals])
    )
    start = time.monotonic()
    r = _run("import time\n" + code)
    return r, time.monotonic() - start


def test_a_ctrl_c_while_a_finished_command_closes_is_said_in_one_line_and_exits_130():
    """It died of the signal (130 to the shell) with no word: the outputs are complete, and the
    line says so. Python goes on closing (a record numba's kernels keep is written at exit)."""
    r, _ = _closing(1.0, signal.SIGINT)
    assert "command done" in r.stdout
    assert r.returncode == 130, (r.returncode, r.stderr)
    assert r.stderr.strip() == (
        "interrupted while closing: the command had finished; what it wrote is complete"
    ), r.stderr


def test_a_sigterm_while_closing_exits_143_and_a_second_ctrl_c_ends_it_at_once():
    r, _ = _closing(1.0, signal.SIGTERM)
    assert r.returncode == 143 and r.stderr.strip().startswith("stopped (SIGTERM) while closing")
    r, took = _closing(60.0, signal.SIGINT, signal.SIGINT)  # a thread that would hold it 60 s
    assert r.returncode == 130 and r.stderr.count("interrupted while closing") == 1, r.stderr
    assert took < 30, took


def test_a_ctrl_c_in_the_last_stretch_of_closing_is_ignored_not_a_silent_death():
    """Past its exit callbacks Python frees its modules (a third of a second with torch and
    OpenVINO) and puts back the default handler of every signal it handled but ignored ones: a
    Ctrl-C there killed the finished command (130 to the shell, no word). From cyto's last
    exit callback on, a stop is ignored: what runs after it (here a callback registered before
    cyto's, so run after it) finishes, and the command exits 0."""
    r = _run(
        """
import atexit, time
import cyto.cli

def after_cyto():
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.3)
    print("closed", flush=True)

atexit.register(after_cyto)
def app(**_how):
    print("command done", flush=True)
    sys.exit(0)
cyto.cli._click_app = lambda: app
cyto.cli.main()
"""
    )
    assert r.stdout.split() == ["command", "done", "closed"], r.stdout
    assert (r.returncode, r.stderr) == (0, ""), (r.returncode, r.stderr)


def test_a_call_stopped_while_it_imports_leaves_the_next_call_whole(tmp_path, monkeypatch):
    """Hostile round 56, 1: Ctrl-C in a notebook while cyto's first call imported numba left
    numba's finished submodules behind without numba itself, and every later call failed with
    "module 'numba' has no attribute 'core'" until a restart. A public call stopped so drops
    what the stopped import left; the next imports it whole."""
    import sys

    import pytest

    from cyto.api import _front_door

    pkg = tmp_path / "halfpkg"
    pkg.mkdir()
    (pkg / "sub.py").write_text("value = 7\n")
    marker = tmp_path / "stopped-once"
    (pkg / "__init__.py").write_text(
        "import pathlib\nimport halfpkg.sub\n"
        f"_m = pathlib.Path({str(marker)!r})\n"
        "if not _m.exists():\n    _m.write_text('x')\n    raise KeyboardInterrupt\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    @_front_door
    def uses_it() -> int:
        import halfpkg

        return halfpkg.sub.value

    try:
        with pytest.raises(KeyboardInterrupt):
            uses_it()
        assert "halfpkg.sub" not in sys.modules  # what the stopped import left, dropped
        assert uses_it() == 7
    finally:
        for name in [n for n in sys.modules if n.split(".")[0] == "halfpkg"]:
            del sys.modules[name]


def test_a_helper_thread_stops_at_a_ctrl_c_but_leaves_it_to_the_main_thread(monkeypatch):
    """Hostile round 62, 3: a helper thread (the threshold thread, a --download's progress in
    it) took the recorded Ctrl-C for itself: where the main thread's had been swallowed in a C
    callback, nothing was left for it, and the run went on. A helper stops; the main thread
    still meets the Ctrl-C, once."""
    import threading

    from cyto import interrupts

    monkeypatch.setattr(interrupts, "_pending", True)
    met = []

    def helper():
        try:
            interrupts.check()
        except KeyboardInterrupt:
            met.append("helper")

    t = threading.Thread(target=helper)
    t.start()
    t.join()
    assert met == ["helper"]
    with pytest.raises(KeyboardInterrupt):
        interrupts.check()
    interrupts.check()  # once: the main thread took it
