"""Ctrl-C at random moments of `cyto score` with workers: is it ever lost, or does a worker print
a traceback? Each trial scores a synthetic slide, sends SIGINT to the whole process group (what
a terminal's Ctrl-C does) a random time after the tile loop starts, and checks what a user sees:
a non-zero exit, "rerun with --resume", no "Traceback". The early moments are where it went
wrong: workers still starting up, and the first numba compile of the model's head.

    python benchmarks/reliability/ctrl_c_trials.py --model BUNDLE --trials 40 \\
        --out benchmarks/results/...

BUNDLE is an exported model (`cyto export`); without --slide a 4096 px synthetic slide is made.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def trial(slide: Path, model: Path, out: Path, delay: float, workers: int) -> dict:
    cmd = [sys.executable, "-m", "cyto", "score", str(slide), "--model", str(model)]
    cmd += ["--out", str(out), "--workers", str(workers), "--tile", "512", "--mosaic", "0"]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as in a terminal
    )
    state = out / slide.stem / ".partial" / "state.json"
    t0 = time.time()
    while not state.exists() and time.time() - t0 < 120 and proc.poll() is None:
        time.sleep(0.02)
    time.sleep(delay)
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=300)
    said = stdout + stderr
    row = {
        "delay_s": round(delay, 3),
        "returncode": proc.returncode,
        "lost": proc.returncode == 0,
        "traceback": "Traceback" in stderr,
        "resume_hint": "rerun with --resume" in said,
    }
    row["ok"] = not row["lost"] and not row["traceback"] and row["resume_hint"]
    if not row["ok"]:
        row["stderr_tail"] = stderr[-2000:]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True, help="an exported model bundle")
    ap.add_argument("--slide", type=Path, help="a slide (default: a synthetic 4096 px one)")
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--max-delay", type=float, default=1.5, help="seconds after the loop starts")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True, help="folder for ctrl_c_trials.json")
    args = ap.parse_args()

    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="cyto-ctrl-c-") as tmp:
        work = Path(tmp)
        slide = args.slide
        if slide is None:
            from cyto.data.synth.slide import SlideSynthConfig, write_slide

            cfg = SlideSynthConfig(width=4096, height=4096, seed=7)
            slide = write_slide(work / "big.tif", cfg).paths[0]
        rows = []
        for i in range(args.trials):
            out = work / f"o{i}"
            row = trial(slide, args.model, out, rng.uniform(0, args.max_delay), args.workers)
            shutil.rmtree(out, ignore_errors=True)
            rows.append(row)
            print(f"trial {i}: {'ok' if row['ok'] else 'BAD'} {row}", flush=True)
    bad = [r for r in rows if not r["ok"]]
    summary = {
        "trials": len(rows),
        "bad": len(bad),
        "lost": sum(r["lost"] for r in rows),
        "traceback": sum(r["traceback"] for r in rows),
        "max_delay_s": args.max_delay,
        "workers": args.workers,
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ctrl_c_trials.json").write_text(json.dumps(summary, indent=1))
    print(
        f"{len(bad)} of {len(rows)} trials went wrong ({summary['lost']} lost the Ctrl-C, "
        f"{summary['traceback']} printed a traceback)"
    )


if __name__ == "__main__":
    main()
