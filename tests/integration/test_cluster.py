"""`cyto score --ray`: a cohort scored on a Ray cluster gives the tables of a plain run; a worker
killed by PID mid-slide is replaced and the slide resumed from its finished chunks; a bad slide
is reported while the others go on.

Two clusters: one started by the driver (``ray.init`` with 2 CPUs), and a head plus a second
node started with ``ray start`` on this machine (two Ray nodes, one engine each)."""

from __future__ import annotations

import csv
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from cyto.cohort import score_cohort
from cyto.data.synth.slide import SlideSynthConfig, write_slide
from cyto.infer import ScoreOptions
from tests.killers import ChunkKiller
from tests.tables import same_table

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.ray, pytest.mark.slow]

OPTS = ScoreOptions(mosaic=0, workers=0, tile=512)


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    """Three small synthetic slides (16, 4 and 6 tiles) and a file that is no slide."""
    root = tmp_path_factory.mktemp("cohort")
    sizes = [(2048, 2048), (1024, 1024), (1536, 1024)]
    slides = [
        write_slide(root / f"s{i}.tif", SlideSynthConfig(width=w, height=h, seed=10 + i)).paths[0]
        for i, (w, h) in enumerate(sizes)
    ]
    bad = root / "broken.tif"
    bad.write_bytes(b"II*\x00 this is not a slide")
    return slides, bad


@pytest.fixture(scope="module")
def plain(exported_dsvdd, cohort, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("plain")
    done, failed = score_cohort(cohort[0], exported_dsvdd, out, OPTS, echo=lambda m: None)
    assert len(done) == 3 and not failed
    return out


def _same_tables(a: Path, b: Path, names) -> None:
    for name in names:
        for table in ("scores.parquet", "topk.parquet"):
            left, right = pq.read_table(a / name / table), pq.read_table(b / name / table)
            assert left.num_rows > 0
            assert same_table(left, right), f"{name}/{table} differs from the plain run"


def _rows(out: Path) -> dict[str, dict]:
    with open(out / "cohort.csv", newline="") as fh:
        return {Path(r["slide"]).stem: r for r in csv.DictReader(fh)}


@pytest.fixture
def shutdown_ray():
    yield
    ray.shutdown()


def test_a_local_ray_cohort_equals_the_plain_run(
    exported_dsvdd, cohort, plain, tmp_path, shutdown_ray
):
    from cyto.cohort.ray import score_cohort_ray

    slides, bad = cohort
    out = tmp_path / "ray"
    said: list[str] = []
    done, failed = score_cohort_ray(
        [*slides, bad], exported_dsvdd, out, OPTS, "local", said.append, split_tiles=8, num_cpus=2
    )
    assert len(done) == 3
    _, [(_, expected)] = score_cohort([bad], exported_dsvdd, tmp_path / "p", OPTS, lambda m: None)
    assert [(s, str(e), e.exit_code) for s, e in failed] == [
        (bad, str(expected), expected.exit_code)
    ]  # the error of a plain run, in one line
    _same_tables(plain, out, ["s0", "s1", "s2"])  # same cells, same ids, same scores
    # ranked over the whole slide when its tiles were scored in parts, each cell's morphometric
    # score (the bundle records it) beside
    merged = pq.read_table(out / "s0" / "scores.parquet")
    assert merged["morphometry_score"].null_count == 0
    assert sorted(merged["rank"].to_pylist()) == list(range(1, merged.num_rows + 1))
    by_slide = {Path(s["slide"]).stem: s for s in done}
    assert by_slide["s0"]["tiles"]["parts"] == 2  # 16 tiles in parts of 8, merged
    assert "parts" not in by_slide["s1"]["tiles"]
    assert not (out / "s0" / ".parts").exists()
    assert any("16 tiles, scored in 2 parts" in m for m in said)
    # the cluster --ray local started is said so: "joined the Ray cluster at ..." read as
    # another's (hostile round 67, 10)
    assert any(re.match(r"started a local Ray cluster at \S+ \(2 CPUs\)$", m) for m in said), said
    rows = _rows(out)
    assert {k: r["status"] for k, r in rows.items()} == {
        "s0": "scored",
        "s1": "scored",
        "s2": "scored",
        "broken": "failed",
    }
    assert rows["s1"]["cells"] == str(by_slide["s1"]["cells_scored"])
    assert rows["s1"]["node"].startswith(socket.gethostname() + ":")
    assert "broken.tif" in rows["broken"]["error"]
    # a second run that began before these were finished (no --resume, no --overwrite: its
    # check found none) refuses each where its engine takes it, whole or in parts, as a run on
    # one machine does: two Ray runs into one --out scored them twice (hostile round 78, 1)
    from cyto.outputs_check import FRESH_ONLY

    sealed = {n: (out / n / "seal.json").read_bytes() for n in ("s0", "s1")}
    token = FRESH_ONLY.set(True)
    try:
        done, failed = score_cohort_ray(
            slides[:2], exported_dsvdd, out, OPTS, "local", said.append, split_tiles=8, num_cpus=2
        )
    finally:
        FRESH_ONLY.reset(token)
    assert done == [] and len(failed) == 2, said
    for _, exc in failed:
        assert "was finished by another run after this one began" in str(exc), exc
    assert {n: (out / n / "seal.json").read_bytes() for n in sealed} == sealed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """A Ray head and a second node on this machine, one CPU each, started with `ray start`."""
    port = _free_port()
    ray_bin = str(Path(sys.executable).with_name("ray"))
    common = ["--num-cpus", "1", "--block", "--disable-usage-stats"]
    # joining a cluster needs the token mode said (Ray 2.60 sends no token otherwise)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token"}
    logs = tmp_path_factory.mktemp("raylogs")
    procs = []

    def start(args, name):
        log = open(logs / name, "w")  # noqa: SIM115 - closed with the process
        procs.append(
            (
                subprocess.Popen(
                    [ray_bin, "start", *args, *common],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                ),
                log,
            )
        )

    address = f"127.0.0.1:{port}"
    start(
        [
            "--head",
            "--port",
            str(port),
            "--node-ip-address",
            "127.0.0.1",
            "--include-dashboard",
            "false",
        ],
        "head.log",
    )
    try:
        _wait_for_nodes(address, 1, logs)
        start(["--address", address, "--node-ip-address", "127.0.0.1"], "node.log")
        _wait_for_nodes(address, 2, logs)
        yield address
    finally:
        for p, _ in reversed(procs):
            os.killpg(p.pid, signal.SIGTERM)
        leave_by = time.monotonic() + 1.0
        for p, log in reversed(procs):
            try:  # a `ray start --block` node took 30 s to leave on SIGTERM: the test is over
                p.wait(max(leave_by - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            log.close()


def _wait_for_nodes(address: str, n: int, logs: Path) -> None:
    """Until ``n`` nodes are alive: one driver, connected once, asks every 0.2 s (a driver per
    poll cost a second each)."""
    code = (
        "import ray, sys, time; ray.init(address=sys.argv[1], log_to_driver=False)\n"
        "deadline = time.monotonic() + 100\n"
        "while sum(x['Alive'] for x in ray.nodes()) < int(sys.argv[2]):\n"
        "    if time.monotonic() > deadline: sys.exit(3)\n"
        "    time.sleep(0.2)\n"
        "print('up')"
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            got = subprocess.run(
                [sys.executable, "-c", code, address, str(n)],
                capture_output=True,
                text=True,
                timeout=110,
                env={**os.environ, "RAY_AUTH_MODE": "token"},
            ).stdout.split()
        except subprocess.TimeoutExpired:
            got = []
        if got[-1:] == ["up"]:
            return
        time.sleep(0.5)  # the head was not listening yet
    text = "\n".join(f.read_text()[-2000:] for f in sorted(logs.iterdir()))
    raise AssertionError(f"the Ray cluster did not reach {n} nodes:\n{text}")


def test_a_worker_killed_mid_slide_is_replaced_and_the_slide_resumed(
    exported_dsvdd, cohort, plain, two_nodes, tmp_path, shutdown_ray
):
    from dataclasses import replace

    from cyto.cohort.ray import score_cohort_ray

    slides, _ = cohort
    out = tmp_path / "killed"
    opts = replace(OPTS, chunk_cells=4)  # a chunk per tile: kills land mid-slide
    # s0 is scored in parts of 8 tiles (.parts/*/.partial), s2 whole (its .partial)
    killers = [
        ChunkKiller(out / "s0", ".parts/*/.partial/chunk-*.parquet"),
        ChunkKiller(out / "s2", ".partial/chunk-*.parquet"),
    ]
    for k in killers:
        k.start()
    said: list[str] = []
    try:
        done, failed = score_cohort_ray(
            [slides[0], slides[2], slides[1]],
            exported_dsvdd,
            out,
            opts,
            two_nodes,
            said.append,
            split_tiles=8,
        )
    finally:
        for k in killers:
            k.stop.set()
    assert [k.folder.name for k in killers if not k.killed] == [], said
    assert not failed
    _same_tables(plain, out, ["s0", "s1", "s2"])  # nothing lost, nothing scored twice
    by_slide = {Path(s["slide"]).stem: s for s in done}
    assert by_slide["s2"]["cells_resumed"] > 0  # the replacement went on from the chunks
    assert by_slide["s0"]["tiles"]["parts"] == 2 and by_slide["s0"]["cells_resumed"] > 0
    assert sum("died" in m and "resumes from the finished chunks" in m for m in said) == 2
    rows = _rows(out)
    assert rows["s0"]["attempts"] == "2" and rows["s2"]["attempts"] == "2"
    assert rows["s1"]["attempts"] == "1"
    nodes = {n for r in rows.values() for n in r["node"].split()}
    assert len(nodes) >= 2  # both Ray nodes scored
    for k in killers:  # the killed processes are gone
        with pytest.raises(ProcessLookupError):
            os.kill(k.killed, 0)


def test_cli_on_a_cluster_reports_a_bad_slide_and_scores_the_rest(
    exported_dsvdd, cohort, plain, two_nodes, tmp_path
):
    from cyto.runtime.devices import cuda_available
    from tests.cli_runner import run_cyto

    slides, bad = cohort
    out = tmp_path / "cli"
    args = [
        "score",
        str(slides[1]),
        str(bad),
        *("--model", str(exported_dsvdd), "--out", str(out)),
        *("--mosaic", "0", "--workers", "0", "--tile", "512"),
    ]
    # a fresh driver, as a user's shell starts it (no auth mode set by an earlier ray.init)
    run = run_cyto(*args, "--ray", two_nodes, unset=("RAY_AUTH_MODE",))
    assert run.returncode == 1, run.stderr  # an unreadable slide, as in a plain run
    assert "failed:" in run.stderr and "broken.tif" in run.stderr and "Traceback" not in run.stderr
    _same_tables(plain, out, ["s1"])
    assert _rows(out)["broken"]["status"] == "failed"
    if not cuda_available():  # an engine that cannot load the model: one line, exit 2
        run = run_cyto(
            *args, "--ray", two_nodes, "--device", "cuda", "--overwrite", unset=("RAY_AUTH_MODE",)
        )
        assert run.returncode == 2 and "cannot start" in run.stderr and "CUDA" in run.stderr
        assert "Traceback" not in run.stderr
    run = run_cyto(*args, "--ray", "127.0.0.1:1", "--overwrite")  # s1's results are there
    assert run.returncode == 2 and "nothing answers there" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


def test_a_ray_run_stopped_by_ctrl_c_says_how_to_go_on_and_rows_what_its_engines_finished(
    cohort, plain, tmp_path
):
    """Hostile round 78, 2 and 4: Ctrl-C of a `cyto score --ray` run said only "interrupted"
    (a run here says how many slides were finished and to rerun with --resume), and a slide an
    engine had sealed just before had no row in cohort.csv (the driver writes a row when it
    collects the result). The driver, stopped with one slide collected and one sealed but not
    yet collected, says both and rows both; one sealed before it began is not its work."""
    import shutil

    from cyto.cohort.ray import _Cohort, _Slide, _Task
    from cyto.location import output_location

    slides, _ = cohort
    out = tmp_path / "o"
    for name in ("s0", "s1", "s2"):
        shutil.copytree(plain / name, out / name)
    earlier = time.time()
    os.utime(out / "s1" / "seal.json", (earlier + 1, earlier + 1))  # sealed by its engine
    os.utime(out / "s2" / "seal.json", (earlier - 60, earlier - 60))  # by an earlier run

    class Engines:  # one engine, started at once
        starting, idle, lost = ["ref"], [], []

        def started(self, ref):
            self.starting = []
            return {"node": "n", "engine": "openvino on cpu"}

        def __len__(self):
            return 1

    class Ray:
        @staticmethod
        def wait(refs, num_returns=1):
            return refs[:1], []

    said: list[str] = []
    driver = _Cohort(Ray(), Engines(), output_location(out), OPTS, said.append, None, None)
    pairs = [(s, out / s.stem) for s in slides]

    def loop(_pairs):  # s0 collected; s1 sealed by its engine, s2 before: both still out
        import json

        class Bar:
            def advance(self, n):
                pass

            def set_postfix(self, text):
                pass

        driver.bar = Bar()
        driver._finish(
            _Slide(slides[0], out / "s0"), json.loads((out / "s0" / "summary.json").read_text())
        )
        for s in slides[1:]:
            item = _Slide(s, out / s.stem, started=earlier)
            driver.running[f"ref-{s.stem}"] = (None, None, _Task("score", item, False))
        raise KeyboardInterrupt

    driver._loop = loop
    with pytest.raises(KeyboardInterrupt):
        driver.run(pairs)
    assert said[-1] == (
        f"interrupted after 2 of 3 slides were finished in {out}: rerun with --resume to keep "
        "them and continue"
    ), said
    rows = _rows(out)
    assert {k: r["status"] for k, r in rows.items()} == {"s0": "scored", "s1": "scored"}
