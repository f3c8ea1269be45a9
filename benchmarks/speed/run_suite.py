"""Run the whole benchmark suite on this machine: every `cyto bench` command, one result folder.

    python benchmarks/speed/run_suite.py --out benchmarks/results/<label> \
        [--fast-model MODEL.cyto] [--slide SLIDE ...] [--batches 1,8,32,128]

1. Models: ``paper`` is the paper's encoder size (ResNet18, 224 px, Deep SVDD scorer) with random
   weights (throughput does not depend on training); ``fast`` is a trained Deep SVDD bundle with
   the fast preset (``--fast-model``, or trained here on synthetic patches, as `make demo` does).
2. ``cyto bench engine`` on both models: every backend, precision and batch size available here.
3. ``cyto bench scorer``: numba kernels vs sklearn vs numpy.
4. ``cyto bench slide`` on each ``--slide`` with the fast model (ground truth NAME.cells.parquet is
   used when it is next to the slide), including the naive baseline.

Every command is a `cyto` CLI call, printed and recorded in ``suite.json`` with its wall time.
Compare results across machines with ``python benchmarks/speed/report.py``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def cyto(*args: str, log: list) -> None:
    cmd = [sys.executable, "-m", "cyto", *args]
    print("$ cyto " + " ".join(args), flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, check=False)
    log.append(
        {
            "command": "cyto " + " ".join(args),
            "seconds": round(time.perf_counter() - t0, 1),
            "returncode": proc.returncode,
        }
    )
    if proc.returncode != 0:
        print(f"  -> exit {proc.returncode}; the suite goes on", flush=True)


def train_fast_model(work: Path, log: list) -> Path:
    patches = work / "patches"
    model = work / "fast-dsvdd.cyto"
    cyto("synth", "patches", str(patches), "--n-normal", "300", "--n-abnormal", "20", log=log)
    cyto(
        "train",
        "dsvdd",
        "--data",
        str(patches),
        "--normal",
        "normal",
        "--preset",
        "fast",
        "--set",
        "mpp=0.12",
        "--out",
        str(model),
        "--overwrite",
        log=log,
    )
    cyto("export", str(model), log=log)
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="result folder for this machine")
    ap.add_argument("--work", type=Path, default=Path("bench-work"), help="models, scratch")
    ap.add_argument("--fast-model", type=Path, default=None)
    ap.add_argument("--slide", type=Path, action="append", default=[])
    ap.add_argument("--batches", default="1,8,32,128")
    ap.add_argument("--devices", default="auto", help="engine devices: cpu, cuda or auto")
    ap.add_argument("--budget", default="5")
    ap.add_argument("--naive-cells", default="2000")
    ap.add_argument("--workers", default=None, help="slide decode/detect processes")
    ap.add_argument("--skip", default="", help="comma-separated: engine,scorer,slide")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    log: list[dict] = []
    t0 = time.perf_counter()

    from cyto.bench.models import architecture_bundle

    fast = args.fast_model or train_fast_model(args.work, log)
    if "engine" not in skip:
        paper = architecture_bundle(args.work / "paper-resnet18-224.cyto", "resnet18", 224)
        for model in (fast, paper):
            cyto(
                "bench",
                "engine",
                "--model",
                str(model),
                "--batches",
                args.batches,
                "--devices",
                args.devices,
                "--budget",
                args.budget,
                "--results",
                str(args.out / f"engine-{Path(model).stem}"),
                log=log,
            )
    if "scorer" not in skip:
        cyto("bench", "scorer", "--results", str(args.out), log=log)
    if "slide" not in skip:
        for slide in args.slide:
            extra = []
            truth = slide.with_name(f"{slide.stem}.cells.parquet")
            if truth.is_file():
                extra += ["--truth", str(truth)]
            if args.workers:
                extra += ["--workers", args.workers]
            cyto(
                "bench",
                "slide",
                str(slide),
                "--model",
                str(fast),
                "--naive-cells",
                args.naive_cells,
                "--results",
                str(args.out / f"slide-{slide.stem}{slide.suffix.replace('.', '-')}"),
                *extra,
                log=log,
            )
    run = {
        "command": "python benchmarks/speed/run_suite.py " + " ".join(sys.argv[1:]),
        "seconds": round(time.perf_counter() - t0, 1),
        "steps": log,
    }
    record = args.out / "suite.json"  # one entry per run of this script into this folder
    runs = json.loads(record.read_text())["runs"] if record.is_file() else []
    record.write_text(json.dumps({"runs": [*runs, run]}, indent=2))
    print(f"suite done in {run['seconds']} s; results in {args.out}")


if __name__ == "__main__":
    main()
