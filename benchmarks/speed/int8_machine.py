"""int8 on the machine it runs on (issue 32): export, parity of each x86 form, speed, and the
same check on an emulated AVX2-only CPU.

1. ``cyto export --precision int8 --calib CALIB`` on a copy of ``--model``: which forms pass the
   gate here (held-out calibration cells) and which are refused, with the numbers.
2. Every graph verified on the bundle's golden cells here, each int8 x86 form separately
   (``int8-cpu``: 8-bit weights; ``int8-cpu7``: 7-bit weights, first Conv in float), and the
   network's speed on them (ONNX Runtime, 16 cells a call, median of ``--repeats``).
3. ``cyto score SLIDE --precision fp32`` against ``--precision int8`` (the form this CPU gets),
   alternated ``--repeats`` times in one run: cells/s end to end and of the engine.
4. ``--emulate-avx2 N``: the first N golden cells through each int8 form in a Python under
   ``qemu-x86_64 -cpu Haswell`` (AVX2 and FMA, no AVX-512, no VNNI: the kernels an AMD EPYC
   or a pre-Cascade-Lake Xeon gets), against the fp32 reference and against the same graph
   on this CPU. QEMU runs the instructions exactly, saturation included, so these are the
   numbers such a CPU computes; its speed means nothing.

The whole script can also run as on a CPU without VNNI, at native speed: ``python -m
tests.isa_mask avx2 -- python benchmarks/speed/int8_machine.py ...`` (CPUID masked, so ONNX
Runtime, oneDNN and numpy dispatch AVX2's kernels here; the result records ``cpuid_mask`` and the
flags the libraries saw). Parts 1-3 are then that CPU's numbers and its int8/fp32 speed ratio on
this host's cores; what an AMD EPYC's own cores give is not measured.

    cyto train fs-sil --data ../shared/data/bone_marrow --normal LYT --set epochs=1 --out fs.cyto
    cyto synth slide slide.tif --width 3072 --height 3072 --seed 1
    python benchmarks/speed/int8_machine.py --model fs.cyto --calib ../shared/data/bone_marrow \
        --slide slide.tif --emulate-avx2 48 --out benchmarks/results/vm-2core/int8-machine
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _results.py
from _results import machine, score_summary, write  # noqa: E402

FORMS = ("int8-cpu", "int8-cpu7")


def form_scorer(bundle, key: str):
    """A scorer of the bundle's ``key`` graph on the CPU, whatever this CPU would pick, verified
    on the golden cells here (not from the cache) whether it passes or not."""
    from cyto.bundle import load_bundle
    from cyto.runtime.scorer import load_scorer
    from cyto.runtime.verify import read_golden, verify_scorer

    b = load_bundle(bundle, weights=False)
    precision, graph = ("fp32", None) if key == "fp32" else ("int8", b.spec.graphs[key])
    s = load_scorer(b, "onnx", "cpu", precision, verify=False, graph=graph)
    s.verification = verify_scorer(s, read_golden(b), use_cache=False)
    return s


def engine_speed(scorer, images: np.ndarray, repeats: int) -> float:
    x = images[:64]
    scorer.score(x[:16], 16)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        scorer.score(x, 16)
        times.append(time.perf_counter() - t0)
    return len(x) / statistics.median(times)


EMULATED = """
import json, sys, numpy as np
from pathlib import Path
from cyto.bundle import load_bundle
from cyto.runtime.heads import head_for
from cyto.runtime.verify import read_golden, ranking_parity
import onnxruntime as ort
b = load_bundle(Path(sys.argv[1]), weights=False)
g = read_golden(b)
n = int(sys.argv[2])
head = head_for(b)
spec = b.spec.graph("fp32")
out = {}
for key in sys.argv[3:]:
    o = ort.SessionOptions(); o.enable_cpu_mem_arena = False
    f = str(b.path / f"encoder-{key}.onnx")
    s = ort.InferenceSession(f, o, providers=["CPUExecutionProvider"])
    got = np.concatenate([head.finish(s.run([spec.output], {spec.input: g.images[i:i+8]})[0])
                          for i in range(0, n, 8)])
    out[key] = got.tolist()
print("RESULT " + json.dumps(out))
"""


def native_scores(bundle: Path, n: int, key: str) -> np.ndarray:
    """The first ``n`` golden cells through the ``key`` graph on this CPU (as EMULATED does)."""
    import onnxruntime as ort

    from cyto.bundle import load_bundle
    from cyto.runtime.heads import head_for
    from cyto.runtime.verify import read_golden

    b = load_bundle(bundle, weights=False)
    g, head, spec = read_golden(b), head_for(b), b.spec.graph("fp32")
    opts = ort.SessionOptions()
    opts.enable_cpu_mem_arena = False
    s = ort.InferenceSession(
        str(bundle / f"encoder-{key}.onnx"), opts, providers=["CPUExecutionProvider"]
    )
    return np.concatenate(
        [
            head.finish(s.run([spec.output], {spec.input: g.images[i : i + 8]})[0])
            for i in range(0, n, 8)
        ]
    )


def emulated(bundle: Path, n: int, keys: list[str]) -> dict:
    qemu = shutil.which("qemu-x86_64")
    if qemu is None:
        raise SystemExit("--emulate-avx2 needs qemu-x86_64 (apt install qemu-user)")
    t0 = time.perf_counter()
    proc = subprocess.run(
        [qemu, "-cpu", "Haswell", sys.executable, "-c", EMULATED, str(bundle), str(n), *keys],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "2"},
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise SystemExit(f"the emulated run failed: {proc.stderr[-2000:]}")
    scores = {k: np.asarray(v) for k, v in json.loads(lines[0][7:]).items()}
    return {"seconds": round(time.perf_counter() - t0), "scores": scores}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--calib", type=Path, required=True)
    ap.add_argument("--slide", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--emulate-avx2", type=int, default=0, metavar="N")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    from cyto.bundle import load_bundle
    from cyto.export.api import export_bundle
    from cyto.runtime.verify import read_golden

    meta = machine(" ".join(sys.argv))
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        bundle = Path(tmp) / "m.cyto"
        shutil.copytree(args.model, bundle)
        lines: list[str] = []
        t0 = time.perf_counter()
        report = export_bundle(
            bundle, precisions=("fp32", "int8"), calib=args.calib, echo=lines.append
        )
        meta["export_seconds"] = round(time.perf_counter() - t0, 1)
        meta["export_log"] = lines
        meta["refused_at_export"] = report.get("refused", {})
        for key in ("int8-cpu", "int8-cpu7", "int8"):
            entry = report.get(key)
            if entry is None:
                continue
            gate, here = entry["parity_vs_fp32"], entry.get("parity_here") or {}
            rows.append(
                {
                    "part": f"export gate ({entry.get('measured_with', 'this CPU')})",
                    "graph": entry["file"],
                    "status": "added",
                    "cells": gate["cells"],
                    "spearman": round(gate["spearman"], 4),
                    "top10_overlap": round(gate["top10_overlap"], 3),
                    # this CPU's own int8 kernels on the same cells
                    "spearman_here": None if not here else round(here["spearman"], 4),
                    "top10_overlap_here": None if not here else round(here["top10_overlap"], 3),
                }
            )
            print(rows[-1], flush=True)
        b = load_bundle(bundle, weights=False)
        golden = read_golden(b)
        for key in ("fp32", *FORMS):
            if key != "fp32" and key not in b.spec.graphs:
                rows.append({"part": "golden", "graph": key, "status": "refused at export"})
                continue
            s = form_scorer(bundle, key)
            v = s.verification.record
            rows.append(
                {
                    "part": "golden",
                    "graph": s.graph_file,
                    "status": s.verification.status,
                    "cells": v["cells"],
                    "spearman": round(v["parity"]["spearman"], 4),
                    "top10_overlap": round(v["parity"]["top10_overlap"], 3),
                    "max_diff_of_range": v["parity"]["max_diff_of_range"],
                    "cells_per_s": round(engine_speed(s, golden.images, args.repeats), 1),
                }
            )
            print(rows[-1], flush=True)
        ends: dict[str, list[dict]] = {"fp32": [], "int8": []}
        for r in range(args.repeats):
            for p in ("fp32", "int8") if r % 2 == 0 else ("int8", "fp32"):
                out = Path(tmp) / f"score-{p}-{r}"
                s = score_summary(args.slide, bundle, out, "--precision", p, "--workers", "1")
                ends[p].append(s)
        for p, runs in ends.items():
            rows.append(
                {
                    "part": "cyto score",
                    "precision": p,
                    "graph": runs[0]["graph"],
                    "cells": runs[0]["cells_scored"],
                    "cells_per_s": statistics.median(r["cells_per_s"] for r in runs),
                    "engine_cells_per_s": statistics.median(r["engine_cells_per_s"] for r in runs),
                    "verification": runs[0]["verification"]["status"],
                }
            )
            print(rows[-1], flush=True)
        if args.emulate_avx2:
            from cyto.runtime.verify import ranking_parity

            keys = [k for k in FORMS if k in b.spec.graphs]
            n = min(args.emulate_avx2, len(golden.images))
            em = emulated(bundle, n, keys)
            meta["emulated_seconds"] = em["seconds"]
            labels = None if golden.labels is None else golden.labels[:n]
            for key, got in em["scores"].items():
                par = ranking_parity(golden.scores[:n], got, labels)
                here = native_scores(bundle, n, key)
                native = ranking_parity(golden.scores[:n], here, labels)
                rows.append(
                    {
                        "part": "emulated AVX2 (qemu -cpu Haswell)",
                        "graph": f"encoder-{key}.onnx",
                        "cells": par["cells"],
                        "spearman": round(par["spearman"], 4),
                        "top10_overlap": round(par["top10_overlap"], 3),
                        "max_diff_of_range": par["max_diff_of_range"],
                        "passes_gate": par["spearman"] >= 0.99 and par["top10_overlap"] >= 0.9,
                        # the same cells and graph natively: equal scores mean no saturation
                        "native_spearman": round(native["spearman"], 4),
                        "native_top10_overlap": round(native["top10_overlap"], 3),
                        "max_abs_diff_vs_native": float(np.abs(got - here).max()),
                    }
                )
                print(rows[-1], flush=True)
    fp32 = next(r for r in rows if r.get("precision") == "fp32")
    int8 = next(r for r in rows if r.get("precision") == "int8")
    md = [
        "# int8 on the machine it runs on",
        "",
        f"`{meta['command']}`",
        "",
        f"CPU: {meta['cpu']} x{meta['cpu_count']}; flags {' '.join(meta['cpu_flags'])}; "
        f"int8 form for it: {meta['cpu_int8_form']}"
        + (
            f"; **run under a CPUID mask** (`tests/isa_mask {meta['cpuid_mask']}`): the libraries "
            f"dispatch on {' '.join(meta['cpu_flags_dispatched'] or ['?'])}, so these are the "
            "kernels of such a CPU, run on this one"
            if meta.get("cpuid_mask")
            else ""
        ),
        "",
        "| part | graph | status | cells | Spearman | top-10% | max diff / range | cells/s | "
        "same cells natively: Spearman, top-10%, largest difference to the emulated scores; "
        "export: this CPU's own int8 kernels |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["part"] == "cyto score":
            continue
        diff = r.get("max_diff_of_range")
        status = r.get("status", "passes the gate" if r.get("passes_gate") else "FAILS the gate")
        md.append(
            f"| {r['part']} | {r['graph']} | {status} | {r.get('cells', '')} | "
            f"{r.get('spearman', '')} | {r.get('top10_overlap', '')} | "
            f"{'' if diff is None else f'{diff:.2g}'} | {r.get('cells_per_s', '')} | "
            + (
                f"{r['native_spearman']}, {r['native_top10_overlap']}, "
                f"{r['max_abs_diff_vs_native']:.3g} |"
                if "native_spearman" in r
                else f"{r['spearman_here']}, {r['top10_overlap_here']} |"
                if r.get("spearman_here") is not None
                else " |"
            )
        )
    md += [
        "",
        f"`cyto score` (median of {args.repeats}, alternated): fp32 {fp32['cells_per_s']} cells/s "
        f"(engine {fp32['engine_cells_per_s']}), int8 ({int8['graph']}) {int8['cells_per_s']} "
        f"cells/s (engine {int8['engine_cells_per_s']}): "
        f"{int8['cells_per_s'] / fp32['cells_per_s']:.2f}x end to end, "
        f"{int8['engine_cells_per_s'] / fp32['engine_cells_per_s']:.2f}x engine",
        "",
        "Refused at export: " + ("; ".join(meta["refused_at_export"].values()) or "none"),
    ]
    masked = f"_masked-{meta['cpuid_mask']}" if meta.get("cpuid_mask") else ""
    write(args.out, f"int8_machine{masked}", meta, rows, md)


if __name__ == "__main__":
    main()
