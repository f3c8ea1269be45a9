"""Outputs to object storage: ``cyto score SLIDE --out s3://bucket/prefix/`` against a real S3
server (moto's standalone server, the one s3fs's own test suite runs; tests/servers.py), on
loopback. The prefix holds what a local run's folder holds, sealed, and ``--resume`` trusts it only
through the seal, read from the server."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from cyto.data.synth.slide import SlideSynthConfig, write_slide
from cyto.errors import InputPathError, OutputWriteError
from cyto.location import output_location
from tests.cli_runner import run_cyto
from tests.killers import ChunkKiller
from tests.servers import moto_s3
from tests.tables import same_table

pytestmark = pytest.mark.pyvips


@pytest.fixture(scope="module")
def slides(tmp_path_factory):
    """Two small negative slides: pyramidal JPEG-tiled TIFFs (four tiles of 512 px each)."""
    root = tmp_path_factory.mktemp("slides")
    for i, name in enumerate(("a", "b")):
        write_slide(
            root / f"{name}.tif",
            SlideSynthConfig(width=1024, height=1024, seed=5 + i, abnormal_fraction=0.0),
            workers=0,
        )
    return root / "a.tif", root / "b.tif"


@pytest.fixture(scope="module")
def local(slides, exported_dsvdd, tmp_path_factory):
    """The local run the remote ones are compared with."""
    out = tmp_path_factory.mktemp("local")
    proc = _score(slides, exported_dsvdd, out)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with moto_s3(tmp_path_factory.mktemp("moto")) as server:
        server.client().create_bucket(Bucket="out")
        yield server


@pytest.fixture
def aws(s3, monkeypatch, tmp_path):
    """The standard AWS variables pointing at the server; a cache of this test's own (a fresh
    machine's staging folders)."""
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("CYTO_CACHE_DIR", str(tmp_path / "cache"))
    return s3


def _score(slides, model, out, *extra):
    return run_cyto(
        "score", *map(str, slides), "--model", str(model), "--out", str(out),
        "--workers", "0", "--mosaic", "0", "--tile", "512", *extra,
    )  # fmt: skip


def _objects(s3, prefix: str) -> dict[str, bytes]:
    client = s3.client()
    listed = client.list_objects_v2(Bucket="out", Prefix=prefix).get("Contents", [])
    return {
        o["Key"][len(prefix) :]: client.get_object(Bucket="out", Key=o["Key"])["Body"].read()
        for o in listed
    }


def _table(data: bytes):
    return pq.read_table(io.BytesIO(data))


def _forget_staging(tmp_path: Path) -> None:
    """What this machine staged is gone: what follows reads the prefix alone."""
    shutil.rmtree(tmp_path / "cache" / "outputs", ignore_errors=True)


def test_a_cohort_to_s3_is_the_local_run(slides, local, exported_dsvdd, aws, tmp_path):
    """Each slide's folder under the prefix holds the local run's tables, cell for cell, and a
    seal over its files; cohort.csv is at the prefix, naming the remote folders; the summary
    records where it went. The secret key appears nowhere: output, objects, staging files."""
    proc = _score(slides, exported_dsvdd, "s3://out/run1/")
    assert proc.returncode == 0, proc.stderr
    objects = _objects(aws, "run1/")
    for name in ("a", "b"):
        for table in ("scores.parquet", "topk.parquet"):
            remote = _table(objects[f"{name}/{table}"])
            assert remote.num_rows > 0
            assert same_table(remote, pq.read_table(local / name / table)), (name, table)
        seal = json.loads(objects[f"{name}/seal.json"])
        names = {k.split("/", 1)[1] for k in objects if k.startswith(f"{name}/")}
        assert {*seal["files"], "seal.json"} == names
        assert json.loads(objects[f"{name}/summary.json"])["output"] == f"s3://out/run1/{name}"
    rows = objects["cohort.csv"].decode().splitlines()
    assert len(rows) == 3 and "s3://out/run1/a," in rows[1] + rows[2]
    assert "-> s3://out/run1/a" in proc.stdout
    assert not any(k.rpartition("/")[2].startswith(".") for k in objects)  # no temporaries
    written = [proc.stdout, proc.stderr, *(b.decode("latin-1") for b in objects.values())]
    written += [f.read_bytes().decode("latin-1") for f in tmp_path.rglob("*") if f.is_file()]
    assert not any(aws.SECRET in text for text in written)
    assert str(tmp_path / "cache" / "outputs") not in proc.stdout + proc.stderr  # not staging


def test_resume_trusts_the_prefix_only_through_its_seal(
    slides, local, exported_dsvdd, aws, tmp_path
):
    """Read back from the server on a machine that staged nothing: a sealed slide is skipped;
    a slide whose remote summary was edited, or whose publish stopped before its seal, is
    scored again, saying why, and sealed again; without --resume the finished prefix is
    refused in one line naming it."""
    a, b = slides
    assert _score(slides, exported_dsvdd, "s3://out/run2/").returncode == 0
    _forget_staging(tmp_path)
    again = _score(slides, exported_dsvdd, "s3://out/run2/", "--resume")
    assert again.returncode == 0, again.stderr
    for name in ("a", "b"):  # when it was scored, and where (the prefix, never the staging)
        assert re.search(
            rf"{name}\.tif: already scored \([^)]*\) in s3://out/run2/{name}; skipping",
            again.stdout,
        ), again.stdout

    client = aws.client()
    summary = json.loads(client.get_object(Bucket="out", Key="run2/a/summary.json")["Body"].read())
    summary["cells_scored"] += 1  # an edit by hand
    client.put_object(Bucket="out", Key="run2/a/summary.json", Body=json.dumps(summary).encode())
    client.delete_object(Bucket="out", Key="run2/b/seal.json")  # a publish stopped half way
    _forget_staging(tmp_path)
    redo = _score(slides, exported_dsvdd, "s3://out/run2/", "--resume")
    assert redo.returncode == 0, redo.stderr
    assert "already scored" not in redo.stdout
    assert "a.tif: s3://out/run2/a: its outputs changed since they were written (summary.json)" in (
        redo.stdout
    )
    assert "b.tif: s3://out/run2/b: its outputs carry no seal" in redo.stdout
    objects = _objects(aws, "run2/")
    for name in ("a", "b"):
        expected = pq.read_table(local / name / "scores.parquet")
        assert same_table(_table(objects[f"{name}/scores.parquet"]), expected)
        seal = json.loads(objects[f"{name}/seal.json"])
        assert seal["files"]["summary.json"]["bytes"] == len(objects[f"{name}/summary.json"])

    refused = _score([a], exported_dsvdd, "s3://out/run2/")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "error: --out s3://out/run2/a (the finished results of a.tif) exists (pass --overwrite "
        "to replace it, or --resume to keep them where they still hold)"
    ]
    gone = _score([a], exported_dsvdd, "s3://nobucket/run/")  # said before any work
    assert gone.returncode == 1
    assert gone.stderr.strip() == (
        "error: cannot write --out s3://nobucket/run: there is no bucket 'nobucket' (404)"
    )


def test_an_edited_row_of_another_machines_slide_is_drawn_again_from_its_seal(
    slides, exported_dsvdd, aws, tmp_path
):
    """A known gap of issue 68 (class 2): the cohort.csv row of a slide another machine scored
    into the prefix was kept as it was, edited or not (its folder was not pulled here). Its
    summary and seal are now pulled, and the row is drawn again from them, said in one line."""
    import csv

    a, b = slides
    assert _score([a], exported_dsvdd, "s3://out/run5/").returncode == 0
    _forget_staging(tmp_path)  # b is scored by "another machine": nothing of a staged here
    client = aws.client()
    text = client.get_object(Bucket="out", Key="run5/cohort.csv")["Body"].read().decode()
    rows = list(csv.DictReader(io.StringIO(text)))
    true_cells = rows[0]["cells"]
    rows[0]["cells"] = str(int(true_cells) + 1000)  # an edit by hand
    edited = io.StringIO()
    writer = csv.DictWriter(edited, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    client.put_object(Bucket="out", Key="run5/cohort.csv", Body=edited.getvalue().encode())
    proc = _score([b], exported_dsvdd, "s3://out/run5/")
    assert proc.returncode == 0, proc.stderr
    assert "rows of a.tif are drawn again from their folders' seals" in proc.stderr, proc.stderr
    # the table named as the prefix's, never as its staging folder in the cache (round 61, 3)
    said = [ln for ln in proc.stderr.splitlines() if "rows not as cyto wrote them" in ln]
    assert len(said) == 1 and said[0].startswith("warning: s3://out/run5/cohort.csv: "), said
    text = client.get_object(Bucket="out", Key="run5/cohort.csv")["Body"].read().decode()
    got = {Path(r["slide"]).name: r for r in csv.DictReader(io.StringIO(text))}
    assert got["a.tif"]["cells"] == true_cells and set(got) == {"a.tif", "b.tif"}
    objects = _objects(aws, "run5/")  # nothing of a's folder was written again or removed
    assert {"a/scores.parquet", "a/seal.json", "a/summary.json"} <= set(objects)


def test_data_cells_and_review_take_a_scored_folder_by_its_url(
    slides, local, exported_dsvdd, aws, tmp_path, monkeypatch
):
    """``cyto data cells`` and ``cyto review`` read the URL as a path ("s3:/out/... is not a
    folder"). Now the folder is pulled and trusted through its seal (location.scored_folders,
    the rule of view and calibrate): the cells cut are the local run's; a review of a URL needs
    a local --session for its marks, said in one line."""
    import cyto.review.server as review_server
    from tests.cli_runner import run_cyto

    assert _score(slides, exported_dsvdd, "s3://out/run6/").returncode == 0
    _forget_staging(tmp_path)
    cut = {}
    for name, source in (("local", str(local / "a")), ("url", "s3://out/run6/a")):
        proc = run_cyto("data", "cells", source, "--out", str(tmp_path / name))
        assert proc.returncode == 0, proc.stderr
        cut[name] = {
            f.relative_to(tmp_path / name).as_posix(): f.read_bytes()
            for f in sorted((tmp_path / name / "normal").iterdir())
        }
    assert cut["url"] == cut["local"] and len(cut["url"]) > 10

    refused = run_cyto("review", "s3://out/run6/", "--reviewer", "ann")
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        "error: s3://out/run6/ is a URL: give --session DIR, a local folder where the review "
        "and its marks are kept"
    )
    served = []
    monkeypatch.setattr(review_server, "serve", lambda opened, *a, **k: served.append(opened))
    proc = run_cyto(
        "review", "s3://out/run6/", "--reviewer", "ann", "--session", str(tmp_path / "rv")
    )
    assert proc.returncode == 0, proc.stderr
    [opened] = served
    assert (tmp_path / "rv" / "cases.json").is_file() and len(opened.cases) == 2


def test_calibrate_and_view_take_a_scored_folder_by_its_url(
    slides, local, exported_dsvdd, aws, tmp_path
):
    """Issue 67: cyto calibrate and cyto view read local folders only. A slide's folder (or its
    scores.parquet, or a cohort's prefix) given by URL is pulled to cyto's cache and trusted
    through its seal: the calibration is the local tables' own; an edited remote table is
    refused in one line naming the URL, never the staging folder."""
    from cyto.location import scored_here
    from cyto.stats.calibrate import calibrate_from_tables
    from cyto.view.folder import open_view

    assert _score(slides, exported_dsvdd, "s3://out/run3/").returncode == 0
    _forget_staging(tmp_path)
    records = {}
    for how, tables in (
        ("local", [local / "a" / "scores.parquet", local / "b"]),
        ("url", ["s3://out/run3/a/scores.parquet", "s3://out/run3/b"]),
    ):
        model = tmp_path / f"{how}.cyto"
        shutil.copytree(exported_dsvdd, model)
        records[how] = calibrate_from_tables(model, tables, min_cells=10)
    assert records["url"]["quantiles"] == records["local"]["quantiles"]
    assert records["url"]["n"] == records["local"]["n"]

    folder, _ = scored_here("s3://out/run3/")  # a cohort's prefix: each slide's folder
    assert sorted(v.name for v in open_view(folder)) == ["a", "b"]
    # a prefix read, not written, is said to be read (it said "cannot write --out")
    with pytest.raises(InputPathError) as missing:
        scored_here("s3://nobucket/run3/")
    assert (
        str(missing.value) == "cannot read s3://nobucket/run3: there is no bucket 'nobucket' (404)"
    )

    # cyto eval scores reads it by URL too, as the local folder (round 72, 6: "TABLE takes a
    # local path"); these negative slides hold no labels: the same one line of each
    said = {}
    for how, table in (("local", str(local / "a")), ("url", "s3://out/run3/a")):
        proc = run_cyto("eval", "scores", table)
        assert proc.returncode == 2, proc.stderr
        said[how] = proc.stderr.strip().replace(table, "A")
    assert said["url"] == said["local"] and "has no column 'label'" in said["url"], said

    client = aws.client()
    other = client.get_object(Bucket="out", Key="run3/b/scores.parquet")["Body"].read()
    client.put_object(Bucket="out", Key="run3/a/scores.parquet", Body=other)  # a forgery
    proc = run_cyto("calibrate", str(tmp_path / "url.cyto"), "s3://out/run3/a", "--overwrite")
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "s3://out/run3/a" in line and "scores.parquet" in line, line
    assert str(tmp_path / "cache") not in line
    import cyto
    from cyto.errors import ConfigError

    with pytest.raises(ConfigError) as err:  # so does eval, from Python too
        cyto.evaluate("s3://out/run3/a", echo=None)
    assert str(err.value) == line.removeprefix("error: "), (str(err.value), line)


def test_the_python_api_writes_to_s3(slides, local, exported_dsvdd, aws):
    """cyto.score_slide(out="s3://...") takes the same path: the table it returns and the one
    under the prefix are the local run's."""
    import cyto

    table = cyto.score_slide(
        slides[0], exported_dsvdd, "s3://out/api/a/", workers=0, mosaic=0, tile=512, echo=None
    )
    expected = pq.read_table(local / "a" / "scores.parquet")
    assert same_table(table, expected)
    objects = _objects(aws, "api/a/")
    assert same_table(_table(objects["scores.parquet"]), expected)
    assert "seal.json" in objects


def test_a_publish_that_fails_half_way_leaves_no_seal(
    slides, local, exported_dsvdd, aws, monkeypatch, tmp_path
):
    """The second upload of a slide's files is refused: one line naming the prefix, no seal
    under it; the finished result stays on this machine (it is not read back as the prefix's),
    and ``resume`` uploads it without scoring the slide again."""
    import s3fs

    import cyto

    put = s3fs.S3FileSystem.put_file
    calls = []

    def refused(self, *args, **kwargs):
        calls.append(args)
        if len(calls) == 2:
            raise PermissionError("Access Denied")
        return put(self, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "put_file", refused)
    with pytest.raises(OutputWriteError) as info:
        cyto.score_slide(
            slides[1], exported_dsvdd, "s3://out/half/b/", workers=0, mosaic=0, tile=512, echo=None
        )
    assert str(info.value).startswith(
        "cannot write the outputs to s3://out/half/b: access denied (403)"
    )
    assert "the finished result is kept on this machine: run again with resume=True" in str(
        info.value
    )
    assert "cache" not in str(info.value)
    objects = _objects(aws, "half/b/")
    assert len(objects) == 1 and "seal.json" not in objects
    monkeypatch.setattr(s3fs.S3FileSystem, "put_file", put)
    proc = run_cyto("data", "cells", "s3://out/half/b/", "--out", str(tmp_path / "cells"))
    assert proc.returncode != 0  # never read as the prefix's
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: s3://out/half/b: the result scored on this machine was never uploaded there "
        "(its upload failed): score it again with --resume to upload it"
    )
    said: list[str] = []
    table = cyto.score_slide(
        slides[1],
        exported_dsvdd,
        "s3://out/half/b/",
        workers=0,
        mosaic=0,
        tile=512,
        resume=True,
        echo=said.append,
    )
    assert same_table(table, pq.read_table(local / "b" / "scores.parquet"))
    assert any("already scored" in line for line in said), said  # uploaded, not scored again
    objects = _objects(aws, "half/b/")
    assert "seal.json" in objects
    assert same_table(_table(objects["scores.parquet"]), table)


@pytest.mark.ray
@pytest.mark.slow
def test_a_ray_cohort_from_and_to_s3_shares_no_folder(
    slides, local, exported_dsvdd, s3, tmp_path, monkeypatch
):
    """Slides and outputs in the S3 server, the driver and the engines with caches of their own
    (no folder shared): the engine killed mid-slide is replaced and the slide resumed from the
    chunks its node staged; the prefix holds a local run's tables and cohort.csv; a rerun with
    --resume, with nothing staged, skips every slide, read back from the prefix."""
    ray = pytest.importorskip("ray")
    from dataclasses import replace

    from cyto.cohort import score_cohort
    from cyto.cohort.ray import score_cohort_ray
    from cyto.infer import ScoreOptions
    from cyto.slides.remote import slide_ref

    client = s3.client()
    client.create_bucket(Bucket="slides")
    for s in slides:
        client.put_object(Bucket="slides", Key=f"ray/{s.name}", Body=s.read_bytes())
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    driver, node = tmp_path / "driver-cache", tmp_path / "node-cache"
    # the local run's options (_score), a chunk per few cells: the kill lands mid-slide
    opts = ScoreOptions(mosaic=0, workers=0, tile=512, chunk_cells=4)
    monkeypatch.setenv("CYTO_CACHE_DIR", str(node))
    staged_b = output_location("s3://out/ray/").child("b").local
    monkeypatch.setenv("CYTO_CACHE_DIR", str(driver))
    urls = [slide_ref(f"s3://slides/ray/{s.name}") for s in slides]
    env = {**s3.env(), "CYTO_CACHE_DIR": str(node), "CYTO_PROGRESS": "0"}
    ray.init(
        address="local",  # never a cluster another test (or the user) started on this machine
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        runtime_env={"env_vars": env},
    )
    killer = ChunkKiller(staged_b, ".partial/chunk-*.parquet")
    killer.start()
    said: list[str] = []
    try:
        done, failed = score_cohort_ray(
            urls, exported_dsvdd, "s3://out/ray/", opts, "auto", said.append
        )
        killer.stop.set()
        assert killer.killed is not None and not failed, said
        assert sum("died" in m and "resumes from the finished chunks" in m for m in said) == 1
        by_slide = {Path(s["slide"]).stem: s for s in done}
        assert by_slide["b"]["cells_resumed"] > 0
        objects = _objects(s3, "ray/")
        for name in ("a", "b"):
            expected = pq.read_table(local / name / "scores.parquet")
            assert same_table(_table(objects[f"{name}/scores.parquet"]), expected), name
        rows = objects["cohort.csv"].decode().splitlines()
        assert len(rows) == 3 and all(",s3://out/ray/" in r for r in rows[1:])
        # nothing of the slides' outputs on the driver, nor left staged on the node
        assert not any(driver.rglob("*.parquet")) and not any(node.rglob("*.parquet"))
        # resumed from the prefix alone (here by the plain runner: a second cluster's start
        # would double the test's time), nothing of the slides staged here
        shutil.rmtree(node / "outputs")
        said.clear()
        done, failed = score_cohort(
            urls, exported_dsvdd, "s3://out/ray/", replace(opts, resume=True), said.append
        )
        assert not failed and len(done) == 2
        for name in ("a", "b"):
            assert any(
                re.search(rf"{name}\.tif: already scored \([^)]*\) in s3://out/ray/{name}; skip", m)
                for m in said
            ), said
    finally:
        killer.stop.set()
        ray.shutdown()


@pytest.mark.ray
def test_a_ray_node_killed_mid_slide_on_a_cluster_of_several_nodes(
    slides, local, exported_dsvdd, s3, tmp_path, monkeypatch
):
    """A cluster of three Ray nodes on this machine (Ray's own ``cluster_utils``: a raylet each,
    each with a cache of its own, as separate machines have), slides and outputs in the S3
    server: a worker node scoring a slide is killed (raylet and workers) once a chunk of the
    slide is staged there. What it staged dies with it; the slide goes to a node still alive
    and is scored there whole; the prefix holds the local run's tables."""
    pytest.importorskip("ray")
    import ray
    from ray.cluster_utils import Cluster

    from cyto.cohort.ray import score_cohort_ray
    from cyto.infer import ScoreOptions
    from cyto.slides.remote import slide_ref

    client = s3.client()
    client.create_bucket(Bucket="slides")
    for s in slides:
        client.put_object(Bucket="slides", Key=f"nodes/{s.name}", Body=s.read_bytes())
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("CYTO_PROGRESS", "0")
    opts = ScoreOptions(mosaic=0, workers=0, tile=512, chunk_cells=4)
    caches = {name: tmp_path / f"{name}-cache" for name in ("head", "n1", "n2")}
    nodes = {}
    monkeypatch.setenv("CYTO_CACHE_DIR", str(caches["head"]))  # what each raylet inherits
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "include_dashboard": False},
    )
    try:
        for name in ("n1", "n2"):
            monkeypatch.setenv("CYTO_CACHE_DIR", str(caches[name]))
            nodes[name] = cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        staged = {}  # where each node stages each slide's folder
        for name in ("n1", "n2"):
            monkeypatch.setenv("CYTO_CACHE_DIR", str(caches[name]))
            for slide in ("a", "b"):
                staged[name, slide] = output_location("s3://out/nodes/").child(slide).local
        monkeypatch.setenv("CYTO_CACHE_DIR", str(tmp_path / "driver-cache"))
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        killed: list[tuple[str, str]] = []
        stop = threading.Event()

        def kill_a_node_mid_slide() -> None:
            # the head node holds an engine too (and the cluster's state: it stays); of two
            # slides on three engines, one at least is scored on n1 or n2
            while not stop.is_set():
                for (name, slide), folder in staged.items():
                    for chunk in folder.glob(".partial/chunk-*.parquet"):
                        try:  # the slide is being scored there, by this process
                            pid = json.loads((chunk.parent.parent / ".lock").read_text())["pid"]
                        except (OSError, ValueError, KeyError):
                            continue
                        killed.append((name, slide))
                        os.kill(pid, signal.SIGKILL)  # the node's raylet and workers, at once
                        cluster.remove_node(nodes[name], allow_graceful=False)
                        return
                time.sleep(0.005)

        watcher = threading.Thread(target=kill_a_node_mid_slide, daemon=True)
        watcher.start()
        said: list[str] = []
        urls = [slide_ref(f"s3://slides/nodes/{s.name}") for s in slides]
        done, failed = score_cohort_ray(
            urls, exported_dsvdd, "s3://out/nodes/", opts, "auto", said.append
        )
        stop.set()
        assert killed and not failed, said
        [(_, victim)] = killed
        (died,) = [m for m in said if f"{victim}.tif" in m and "died" in m]
        # where the node is known dead by then, the line says its chunks went with it
        assert "resumes from the finished chunks" in died or "its node is gone" in died, died
        assert any(f"{victim}.tif" in m and "from the beginning" in m for m in said), said
        objects = _objects(s3, "nodes/")
        for name in ("a", "b"):
            expected = pq.read_table(local / name / "scores.parquet")
            assert same_table(_table(objects[f"{name}/scores.parquet"]), expected), name
        rows = objects["cohort.csv"].decode().splitlines()
        assert len(rows) == 3 and all(",s3://out/nodes/" in r for r in rows[1:])
    finally:
        ray.shutdown()
        cluster.shutdown()


def _a_tif_and_an_ndpi_in(s3, bucket: str, tif: Path, tmp_path: Path, monkeypatch):
    """``tif`` and a small NDPI uploaded as ``s3://BUCKET/case/``; the standard AWS variables
    hold the credentials only (the endpoint is a storage option); a cache of the test's own.
    Returns the S3 client."""
    for name, value in s3.env().items():
        if name != "AWS_ENDPOINT_URL":
            monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("CYTO_CACHE_DIR", str(tmp_path / "cache"))
    client = s3.client()
    client.create_bucket(Bucket=bucket)
    ndpi = tmp_path / "n.ndpi"
    write_slide(ndpi, SlideSynthConfig(width=1024, height=1024, seed=8), workers=0)
    for path in (tif, ndpi):
        client.upload_file(str(path), bucket, f"case/{path.name}")
    return client


def test_a_slide_scored_by_url_is_read_back_as_it_was_scored(
    slides, exported_dsvdd, s3, tmp_path, monkeypatch
):
    """Hostile round 30, 1 and 2: `cyto data cells` and `cyto review` pulled a scored folder
    with --storage-option but read its slide without it (from AWS, "the server could not be
    reached"), and an NDPI scored with --download could be neither viewed, reviewed nor cut
    ("pass --download", which none of them takes). Each reads the slide as the run read it:
    with the storage options given, an OpenSlide format through the copy in cyto's cache."""
    import cyto.review.server as review_server
    from cyto.view.folder import open_view
    from tests.cli_runner import run_cyto

    _a_tif_and_an_ndpi_in(s3, "kept", slides[0], tmp_path, monkeypatch)
    where = ["--storage-option", f"endpoint_url={s3.endpoint}"]
    urls = ["s3://kept/case/a.tif", "s3://kept/case/n.ndpi"]
    out = tmp_path / "scored"
    proc = _score(urls, exported_dsvdd, out, "--download", *where)
    assert proc.returncode == 0, proc.stderr
    # the TIFF is read in place, the NDPI from its copy here: no "from the server" of it
    # (hostile round 49, 3)
    planned = [ln.split(":")[0] for ln in proc.stdout.splitlines() if "from the server" in ln]
    assert planned == ["a.tif"], proc.stdout
    shutil.rmtree(tmp_path / "cache" / "remote")  # a fresh cache: the copy is fetched again
    for name in ("a", "n"):
        proc = run_cyto("data", "cells", str(out / name), "--out", str(tmp_path / f"c{name}"),
                        *where)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        cells = list((tmp_path / f"c{name}" / "normal").iterdir())
        assert len(cells) == pq.read_table(out / name / "scores.parquet").num_rows > 5
    [view] = open_view(out / "n", options={"endpoint_url": s3.endpoint})
    try:
        assert view.width == 1024 and view.reader(0).read_region(0, 0, 8, 8).shape == (8, 8, 3)
    finally:
        view.close()
    # the TIFF is read in place: its blocks kept on disk while it is viewed go when the viewer
    # lets it go (Ctrl-C left them to the cache's bound: hostile round 52, 9)
    blocks = tmp_path / "cache" / "remote-blocks"
    [view] = open_view(out / "a", options={"endpoint_url": s3.endpoint})
    try:
        assert view.reader(0).read_region(0, 0, 512, 512).shape == (512, 512, 3)
        assert list(blocks.rglob("*.blk"))
    finally:
        view.close()
    assert not list(blocks.rglob("*.blk")), list(blocks.rglob("*"))
    served = []
    monkeypatch.setattr(review_server, "serve", lambda opened, *a, **k: served.append(opened))
    proc = run_cyto("review", str(out), "--reviewer", "ann", "--session", str(tmp_path / "rv"),
                    *where)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert len(served[0].cases) == 2


def test_the_python_api_takes_storage_options_and_download(
    slides, local, exported_dsvdd, s3, tmp_path, monkeypatch
):
    """`cyto.score_slide` took neither storage options nor --download (hostile round 30, 12):
    an S3-compatible store was reached only through AWS_ENDPOINT_URL, and no SVS or NDPI by
    URL at all. Both are keywords now, as the command's flags: the table is the local run's;
    an option no store takes is one line in the caller's words."""
    import warnings

    import cyto
    from cyto.errors import ConfigError

    client = _a_tif_and_an_ndpi_in(s3, "pyapi", slides[0], tmp_path, monkeypatch)
    where = {"endpoint_url": s3.endpoint}
    run = {"workers": 0, "mosaic": 0, "tile": 512, "echo": None}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the small model's scale and adequacy words
        table = cyto.score_slide(
            "s3://pyapi/case/a.tif",
            exported_dsvdd,
            "s3://pyapi/out/a",
            storage_options=where,
            **run,
        )
        assert same_table(table, pq.read_table(local / "a" / "scores.parquet"))
        assert client.head_object(Bucket="pyapi", Key="out/a/seal.json")
        n = cyto.score_slide(
            "s3://pyapi/case/n.ndpi", exported_dsvdd, tmp_path / "n", storage_options=where,
            download=True, **run,
        )  # fmt: skip
    assert n.num_rows > 5
    with pytest.raises(ConfigError) as err:
        cyto.score_slide("s3://pyapi/case/a.tif", exported_dsvdd, tmp_path / "x",
                         storage_options={"endpont_url": s3.endpoint}, **run)  # fmt: skip
    assert str(err.value).startswith("storage_options key 'endpont_url': no option of")
    assert "(did you mean endpoint_url?)" in str(err.value) and not (tmp_path / "x").exists()


def test_a_result_kept_after_a_failed_upload_outlives_the_older_seal_and_any_spelling(
    slides, local, exported_dsvdd, aws, monkeypatch, tmp_path
):
    """Hostile round 31 (1-3): a slide scored again into a prefix that holds its earlier
    result, to a bucket gone read-only: the old seal could not even be removed. `--resume`
    then pulled the old result over the new one and scored again; readers of the cohort's
    prefix served the result that was never uploaded (its folder is not listed there); and a
    result kept under `--out s3://B/r/` was not found by `resume=True` on `s3://B/r/a/`
    (two staging folders for one folder of objects)."""
    import s3fs

    import cyto
    from cyto.location import scored_here

    a = slides[0]
    assert _score([a], exported_dsvdd, "s3://out/keep/").returncode == 0  # the earlier result
    put, rm = s3fs.S3FileSystem.put_file, s3fs.S3FileSystem.rm_file

    def denied(self, *args, **kwargs):
        raise PermissionError("Access Denied")

    monkeypatch.setattr(s3fs.S3FileSystem, "put_file", denied)
    monkeypatch.setattr(s3fs.S3FileSystem, "rm_file", denied)
    again = _score([a], exported_dsvdd, "s3://out/keep/", "--overwrite", "--top-k", "50")
    assert again.returncode != 0
    # the slide's own line first (it was never printed: cohort.csv's failed upload ended the
    # run), then the table's
    failed = [x for x in again.stderr.splitlines() if x.startswith("failed: ")]
    assert len(failed) == 2, again.stderr
    assert failed[0].startswith("failed: ") and failed[0].endswith(
        "the finished result is kept on this machine: run again with --resume to upload it"
    )
    assert failed[1].startswith("failed: cohort.csv was not uploaded to s3://out/keep: access")
    assert len(_table(_objects(aws, "keep/a/")["topk.parquet"])) != 50  # the old one, sealed
    for where in ("s3://out/keep/", "s3://out/keep/a"):  # the prefix, the slide's folder
        with pytest.raises(InputPathError) as err:  # never read as what they hold, and said
            scored_here(where)  # to hold an older result (round 32, 6: as if they held none)
        assert str(err.value) == (
            "s3://out/keep/a: holds an older result; the result scored on this machine was "
            "never uploaded there (its upload failed): score it again with --resume to upload it"
        )
    monkeypatch.setattr(s3fs.S3FileSystem, "put_file", put)
    monkeypatch.setattr(s3fs.S3FileSystem, "rm_file", rm)
    said: list[str] = []
    cyto.score_slide(a, exported_dsvdd, "s3://out/keep/a/", workers=0, mosaic=0, tile=512,
                     top_k=50, resume=True, echo=said.append)  # fmt: skip
    assert any("already scored" in line for line in said), said  # uploaded, not scored again
    assert said[-1] == "a.tif: uploaded to s3://out/keep/a (the result kept on this machine)"
    objects = _objects(aws, "keep/a/")
    assert len(_table(objects["topk.parquet"])) == 50 and "seal.json" in objects
    folder, _ = scored_here("s3://out/keep/")
    assert len(pq.read_table(folder / "a" / "topk.parquet")) == 50


def test_a_result_kept_while_the_store_was_down_outlives_the_older_seal(
    slides, local, exported_dsvdd, aws, monkeypatch
):
    """Hostile round 32 (1): an upload that failed before it could list the prefix (a store
    down: 503, time-out) recorded no seal of the prefix, and `--resume` took the older seal
    there for a newer one: the kept result was thrown away and the slide scored again. The
    prefix's seal is recorded when the run pulls the folder."""
    import cyto
    from cyto.location import OutputLocation
    from cyto.slides.remote import RemoteAccessError

    a = slides[0]
    assert _score([a], exported_dsvdd, "s3://out/down/").returncode == 0  # the earlier result

    def down(self, names):
        raise RemoteAccessError(f"{self}: the server answered 503 (4 tries); giving up")

    real = OutputLocation._publish
    monkeypatch.setattr(OutputLocation, "_publish", down)
    again = _score([a], exported_dsvdd, "s3://out/down/", "--overwrite", "--top-k", "50")
    assert again.returncode != 0 and "kept on this machine" in again.stderr
    monkeypatch.setattr(OutputLocation, "_publish", real)
    said: list[str] = []
    cyto.score_slide(a, exported_dsvdd, "s3://out/down/a/", workers=0, mosaic=0, tile=512,
                     top_k=50, resume=True, echo=said.append)  # fmt: skip
    assert said[-1] == "a.tif: uploaded to s3://out/down/a (the result kept on this machine)"
    assert len(_table(_objects(aws, "down/a/")["topk.parquet"])) == 50
    # a kept result scored over (overwrite) is not said to be the one uploaded (round 32, 3)
    monkeypatch.setattr(OutputLocation, "_publish", down)
    assert _score([a], exported_dsvdd, "s3://out/down/", "--overwrite").returncode != 0
    monkeypatch.setattr(OutputLocation, "_publish", real)
    said.clear()
    cyto.score_slide(a, exported_dsvdd, "s3://out/down/a/", workers=0, mosaic=0, tile=512,
                     top_k=20, overwrite=True, echo=said.append)  # fmt: skip
    assert not any("the result kept on this machine" in line for line in said), said
    assert len(_table(_objects(aws, "down/a/")["topk.parquet"])) == 20


def test_a_slide_folder_released_keeps_the_staging_of_a_prefix_under_it(tmp_path, monkeypatch):
    """Hostile round 32 (2): staging is the bucket's, so `s3://B/r/a/x/` stages inside the
    folder of the slide `a` of `s3://B/r/`; publishing that slide removed its staged copy with
    every folder in it: a result kept under `r/a/x/` (and the chunks of a run scoring there)."""
    monkeypatch.setenv("CYTO_CACHE_DIR", str(tmp_path / "cache"))
    slide = output_location("s3://bucket/r/").child("a")
    nested = output_location("s3://bucket/r/a/x/")
    assert nested.local.parent == slide.local
    (nested.local / "b").mkdir(parents=True)
    (nested.local / "b" / "scores.parquet").write_bytes(b"kept")
    (slide.local / ".partial").mkdir()
    (slide.local / "scores.parquet").write_bytes(b"published")
    slide.release()
    assert (nested.local / "b" / "scores.parquet").read_bytes() == b"kept"
    assert not (slide.local / "scores.parquet").exists()
    assert not (slide.local / ".partial").exists()
