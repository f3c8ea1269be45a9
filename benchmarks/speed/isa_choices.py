"""What ``auto`` chooses on this CPU, and every CPU choice on the golden cells (issue 58's
AVX2-only rows): correctness only, no speeds.

For each ``--model`` (a copy, its verification cache dropped, so nothing is read from another
machine's record):

1. What the libraries see: numpy's dispatched instruction sets, whether ONNX Runtime's uint8 x
   int8 kernels sum exactly (:func:`cyto.runtime.machine.int8_kernels_exact`), OpenVINO's
   ``OPTIMIZATION_CAPABILITIES`` and the precisions it offers, the order ``auto`` tries.
2. ``load_scorer(auto, cpu, auto)`` and ``load_scorer(auto, cpu, int8)``: the choice, and the
   notes that say what was considered and passed over.
3. Every backend x precision x graph a CPU can run (ONNX Runtime fp32 and each int8 form,
   OpenVINO fp32, bf16 where offered, and each int8 form), verified on the bundle's golden cells
   here: status, Spearman, top-10% overlap, largest difference over the score range, against
   the bundle's fp32 reference scores.

Meant to run under ``tests/isa_mask``, where it emulates (qemu-user) when the CPU cannot trap
CPUID; the time it takes there means nothing and is not recorded::

    python -m tests.isa_mask avx2 -- .venv/bin/python benchmarks/speed/isa_choices.py \\
        --model fs.cyto --model demo8.cyto --out benchmarks/results/avx2-emulated
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _results.py
from _results import machine, write  # noqa: E402


def what_the_libraries_see() -> dict:
    from numpy._core._multiarray_umath import __cpu_features__ as found

    from cyto.runtime.backends import openvino
    from cyto.runtime.machine import int8_kernels_exact
    from cyto.runtime.scorer import cpu_order

    keys = ("AVX2", "FMA3", "AVX512F", "AVX512BW", "AVX512VNNI", "AVX512_BF16", "AVX512_SPR")
    return {
        "numpy": {k: bool(found.get(k)) for k in keys},
        "ort_int8_exact": int8_kernels_exact(),
        "openvino_caps": list(openvino.cpu_capabilities()),
        "openvino_precisions": list(openvino.precisions_here()),
        "cpu_order": [list(c) for c in cpu_order()],
    }


def auto_choice(bundle: Path, precision: str) -> dict:
    from cyto.runtime.scorer import load_scorer

    s = load_scorer(bundle, "auto", "cpu", precision)
    out = {
        "asked": f"auto/cpu/{precision}",
        "chose": s.describe(),
        "graph": s.graph_file,
        "verification": s.verification.status,
        "notes": list(s.notes),
    }
    s.close()
    return out


def choices(bundle: Path) -> list[tuple[str, str, str]]:
    """(backend, precision, graph key) for every CPU choice this bundle and CPU have."""
    from cyto.bundle import load_bundle
    from cyto.runtime.backends import openvino

    graphs = load_bundle(bundle, weights=False).spec.graphs
    forms = [k for k in ("int8", "int8-cpu", "int8-cpu7") if k in graphs]
    out = [("onnx", "fp32", "fp32"), ("openvino", "fp32", "fp32")]
    if "bf16" in openvino.precisions_here():
        out.append(("openvino", "bf16", "fp32"))
    out += [("onnx", "int8", k) for k in forms if k != "int8"]  # TensorRT's form: GPUs
    out += [("openvino", "int8", k) for k in forms]
    return out


def verified(bundle: Path, backend: str, precision: str, key: str) -> dict:
    from cyto.bundle import load_bundle
    from cyto.runtime.scorer import load_scorer
    from cyto.runtime.verify import read_golden, verify_scorer

    b = load_bundle(bundle, weights=False)
    graph = None if key == "fp32" else b.spec.graphs[key]
    s = load_scorer(b, backend, "cpu", precision, verify=False, graph=graph)
    v = verify_scorer(s, read_golden(b))  # the copy's cache: what this run computed here
    s.close()
    p = v.record["parity"]
    return {
        "backend": backend,
        "precision": precision,
        "graph": b.spec.graphs[key].file,
        "export_gate_passed": b.spec.graphs[key].parity_passed,
        "status": v.status,
        "cells": v.record["cells"],
        "spearman": round(p["spearman"], 5),
        "top10_overlap": round(p["top10_overlap"], 3),
        "max_diff_of_range": p["max_diff_of_range"],
        "parity": p,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, action="append", required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    meta = machine(" ".join(sys.argv))
    meta["seen"] = what_the_libraries_see()
    print(meta["seen"], flush=True)
    rows, autos = [], []
    meta["finished"] = False
    try:
        for model in args.model:
            with tempfile.TemporaryDirectory() as tmp:
                bundle = Path(tmp) / model.name
                ignore = shutil.ignore_patterns("verified", "engines")
                shutil.copytree(model, bundle, ignore=ignore)
                for backend, precision, key in choices(bundle):
                    row = verified(bundle, backend, precision, key)
                    rows.append({"model": model.name, **row})
                    print({k: v for k, v in rows[-1].items() if k != "parity"}, flush=True)
                # auto reads the records the choices above wrote (the same numbers it would
                # compute), then verifies what it tries beyond them
                for precision in ("auto", "int8"):
                    autos.append({"model": model.name, **auto_choice(bundle, precision)})
                    print(autos[-1], flush=True)
        meta["finished"] = True
    finally:  # stopped (Ctrl-C: too slow under an emulator): what finished, said so
        report(args.out, meta, rows, autos)


def report(out: Path, meta: dict, rows: list[dict], autos: list[dict]) -> None:
    meta["auto"] = autos
    seen = meta["seen"]
    md = [
        "# What `auto` chooses, and every CPU choice on the golden cells",
        "",
        f"`{meta['command']}`",
        "",
        *([] if meta["finished"] else ["**Stopped before it finished**: the rows below ran.", ""]),
        f"CPUID mask: {meta['cpuid_mask']}; numpy dispatches on "
        f"{', '.join(k for k, v in seen['numpy'].items() if v)}; ONNX Runtime's int8 kernels "
        f"sum exactly: {seen['ort_int8_exact']}; OpenVINO reports "
        f"{', '.join(seen['openvino_caps'])} and offers {', '.join(seen['openvino_precisions'])}; "
        f"/proc/cpuinfo (the host's): {' '.join(meta['cpu_flags'])}",
        "",
        "| model | asked | chose | verification |",
        "|---|---|---|---|",
        *(f"| {a['model']} | {a['asked']} | {a['chose']} | {a['verification']} |" for a in autos),
        "",
        "| model | backend | precision | graph | export gate | here | Spearman | top-10% | "
        "max diff / range |",
        "|---|---|---|---|---|---|---|---|---|",
        *(
            f"| {r['model']} | {r['backend']} | {r['precision']} | {r['graph']} | "
            f"{'passed' if r['export_gate_passed'] else 'refused'} | {r['status']} | "
            f"{r['spearman']} | {r['top10_overlap']} | {r['max_diff_of_range']:.2g} |"
            for r in rows
        ),
        "",
        "Notes of `auto`:",
        "",
        # a compile time under an emulator is no speed: left out here (kept in the .json)
        *(
            f"- {a['model']}, {a['asked']}: "
            + re.sub(r" in [0-9.]+ s\b", "", " | ".join(a["notes"]))
            for a in autos
        ),
    ]
    write(out, "isa_choices", meta, rows, md)


if __name__ == "__main__":
    main()
