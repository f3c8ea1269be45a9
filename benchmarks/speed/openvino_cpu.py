"""ONNX Runtime against OpenVINO on this CPU (issue 58): the order ``auto`` tries CPU choices in.

For each ``--model``, every (backend, precision, graph) this CPU can run is loaded as ``cyto
score`` loads it (verified on the bundle's golden cells here; a choice that fails is listed with
its numbers and not timed), then timed on the golden cells, ``--batch`` cells a call, the
network alone (no head), ``--rounds`` rounds alternating the choices, each round ``--calls``
calls after two warm-up calls. The cores are shared with other work, so the median over rounds
is reported, with the spread. OpenVINO's performance hint (``LATENCY`` against ``THROUGHPUT``)
is timed as well (``--hints``).

    python benchmarks/speed/openvino_cpu.py --model demo.cyto --model fs.cyto \
        --out benchmarks/results/epyc-2core/openvino
    python -m tests.isa_mask avx2 -- python benchmarks/speed/openvino_cpu.py ...  # AVX2 only
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _results.py
from _results import machine, write  # noqa: E402

# (backend, precision, the bundle's graph key: None = what the runtime picks for this CPU)
CHOICES = (
    ("onnx", "fp32", None),
    ("openvino", "fp32", None),
    ("openvino", "bf16", None),
    ("onnx", "int8", "int8-cpu"),
    ("onnx", "int8", "int8-cpu7"),
    ("openvino", "int8", "int8-cpu"),
    ("openvino", "int8", "int8-cpu7"),
    ("openvino", "int8", "int8"),
)


def load(bundle, backend: str, precision: str, key: str | None, threads: int, hint: str):
    from cyto.runtime.backends import openvino
    from cyto.runtime.scorer import load_scorer
    from cyto.runtime.verify import read_golden, verify_scorer

    openvino.PERFORMANCE_HINT = hint
    graph = bundle.spec.graphs[key] if key else None
    s = load_scorer(bundle, backend, "cpu", precision, threads=threads, verify=False, graph=graph)
    s.verification = verify_scorer(s, read_golden(bundle), use_cache=False)
    return s


def cells_per_s(scorer, images, batch: int, calls: int) -> float:
    x = images[:batch]
    for _ in range(2):
        scorer.backend.run(x)
    t0 = time.perf_counter()
    for _ in range(calls):
        scorer.backend.run(x)
    return batch * calls / (time.perf_counter() - t0)


def main() -> None:
    from cyto.bundle import load_bundle
    from cyto.errors import CytoError
    from cyto.runtime.machine import cpu_info, openvino_cpu
    from cyto.runtime.verify import read_golden

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, action="append", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--hints", default="LATENCY,THROUGHPUT")
    args = ap.parse_args()
    hints = args.hints.split(",")
    rows = []
    for model in args.model:
        bundle = load_bundle(model, weights=False)
        images = read_golden(bundle).images
        runners = {}
        for backend, precision, key in CHOICES:
            if key is not None and key not in bundle.spec.graphs:
                continue
            for hint in hints if backend == "openvino" else ["-"]:
                name = (backend, precision, key or "", hint)
                base = {
                    "model": model.name,
                    "method": bundle.method,
                    "backbone": bundle.spec.backbone,
                    "size": bundle.spec.crop_size,
                    "backend": backend,
                    "precision": precision,
                    "graph_key": key or "",
                    "hint": hint,
                    "batch": args.batch,
                    "threads": args.threads,
                }
                try:
                    s = load(bundle, backend, precision, key, args.threads, hint)
                except CytoError as exc:
                    rows.append({**base, "available": False, "reason": str(exc)})
                    print(f"{model.name} {name}: unavailable ({exc})")
                    continue
                v = s.verification
                base.update(
                    graph=s.graph_file, verification=v.status, parity=v.record.get("parity")
                )
                if not v.passed:
                    rows.append({**base, "available": False, "reason": v.words()})
                    print(f"{model.name} {name}: {v.words()}")
                    s.close()
                    continue
                runners[name] = (s, base)
        speeds = {name: [] for name in runners}
        for r in range(args.rounds):
            order = list(runners) if r % 2 == 0 else list(runners)[::-1]
            for name in order:
                speeds[name].append(cells_per_s(runners[name][0], images, args.batch, args.calls))
        for name, (s, base) in runners.items():
            v = speeds[name]
            rows.append(
                {
                    **base,
                    "available": True,
                    "cells_per_s": round(statistics.median(v), 1),
                    "min": round(min(v), 1),
                    "max": round(max(v), 1),
                    "rounds": [round(x, 1) for x in v],
                }
            )
            print(
                f"{model.name} {name}: {statistics.median(v):.1f} cells/s "
                f"({min(v):.1f}-{max(v):.1f})"
            )
            s.close()
    cpu = cpu_info()
    meta = {
        **machine(),
        "cpu_flags": list(cpu.flags),
        "openvino": openvino_cpu(),
        "cpuid_mask": os.environ.get("ISA_MASK"),
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    md = [
        f"# ONNX Runtime and OpenVINO on {cpu.model}",
        "",
        f"flags {' '.join(cpu.flags)}; OpenVINO {meta['openvino']}; CPUID mask "
        f"{meta['cpuid_mask'] or 'none'}; {args.threads} threads, {args.batch} cells a call, "
        f"median of {args.rounds} alternating rounds (shared cores: min-max shown)",
        "",
        "| model | backend | precision | graph | hint | cells/s | min-max | Spearman |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("available"):
            sp = (r.get("parity") or {}).get("spearman")
            md.append(
                f"| {r['model']} | {r['backend']} | {r['precision']} | {r['graph']} | "
                f"{r['hint']} | {r['cells_per_s']} | {r['min']}-{r['max']} | "
                f"{sp:.4f} |"
            )
        else:
            md.append(
                f"| {r['model']} | {r['backend']} | {r['precision']} | "
                f"{r['graph_key']} | {r['hint']} | - | - | {r['reason'][:120]} |"
            )
    tag = "openvino_cpu" + (f"_masked-{meta['cpuid_mask']}" if meta["cpuid_mask"] else "")
    write(args.out, tag, meta, rows, md)


if __name__ == "__main__":
    main()
