"""The bulk check of the calibration on real cells from two labs (issue 18): a model trained and
calibrated on one lab's normal cells, then shown cells of the same lab and of another lab.

Deep SVDD (fast preset) is trained on half of the bone-marrow lymphocytes (Matek, LYT); the other
half is split into calibration groups (as if each were a slide-negative slide, GROUP cells each)
and one held-out group. Two "slides" are then checked against that calibration: the held-out
lymphocytes with abnormal cells of the same lab added (BLA, PMO, EOS, MON) at witness rate WR,
and lymphocytes of the peripheral-blood lab (PBC, another lab, stain and scanner) with its
abnormal cells (ig, erythroblast, monocyte, basophil) at the same rate. Expected: the same-lab
slide passes the bulk check and gets a burden; the other lab's slide is called a mismatch.
These are patch sets, not whole slides: the slide pipeline's crops are not involved.

    python benchmarks/burden/burden_cross_lab.py --bone-marrow ../shared/data/bone_marrow \
        --pbc ../shared/data/pbc --seeds 0,1,2 --results benchmarks/results/vm-2core/burden
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from cyto.bench.results import markdown_table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _results.py
from _results import machine, mean_sd, write  # noqa: E402

BM_ABNORMAL, PBC_ABNORMAL = (
    ("BLA", "PMO", "EOS", "MON"),
    ("ig", "erythroblast", "monocyte", "basophil"),
)


def _files(root: Path, cls: str) -> list[Path]:
    return sorted(p for p in (root / cls).iterdir() if p.suffix.lower() in (".png", ".jpg", ".tif"))


def _manifest(path: Path, rows: list[tuple[Path, str]]) -> Path:
    path.write_text("path,label\n" + "".join(f"{p.resolve()},{c}\n" for p, c in rows))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--bone-marrow", type=Path, required=True)
    ap.add_argument("--pbc", type=Path, required=True)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--group", type=int, default=40, help="cells per calibration group")
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--wr", type=float, default=0.09)
    ap.add_argument("--results", type=Path, required=True)
    args = ap.parse_args()

    import pyarrow.parquet as pq

    from cyto.predict import predict
    from cyto.stats import calibrate
    from cyto.train.api import train

    t0 = time.perf_counter()
    rows = []
    lyt, pbc_lym = _files(args.bone_marrow, "LYT"), _files(args.pbc, "lymphocyte")
    bm_abn = [(p, c) for c in BM_ABNORMAL for p in _files(args.bone_marrow, c)]
    pbc_abn = [(p, c) for c in PBC_ABNORMAL for p in _files(args.pbc, c)]
    for seed in [int(s) for s in args.seeds.split(",")]:
        rng = np.random.default_rng(seed)
        order = rng.permutation(len(lyt))
        n_train = len(lyt) // 2
        train_idx = order[:n_train]
        cal_idx = order[n_train : n_train + args.group * args.groups]
        test_idx = order[n_train + args.group * args.groups :][: args.group * 2]
        n_abn = max(1, round(len(test_idx) * args.wr / (1 - args.wr)))
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            train_csv = _manifest(tmp / "train.csv", [(lyt[i], "LYT") for i in train_idx])
            res = train(
                "dsvdd",
                train_csv,
                tmp / "m.cyto",
                normal="LYT",
                preset="fast",
                overrides={"seed": seed},
                device="cpu",
            )

            def scores(name, cells, tmp=tmp, bundle=res.bundle):
                out = tmp / f"{name}.parquet"
                predict(bundle, _manifest(tmp / f"{name}.csv", cells), out)
                return np.asarray(pq.read_table(out)["score"], dtype=np.float64)

            parts = [
                scores(f"cal{g}", [(lyt[i], "LYT") for i in cal_idx[g :: args.groups]])
                for g in range(args.groups)
            ]
            same = [(lyt[i], "LYT") for i in test_idx]
            same += [bm_abn[i] for i in rng.choice(len(bm_abn), n_abn, replace=False)]
            pick = rng.choice(len(pbc_lym), len(test_idx), replace=False)
            other = [(pbc_lym[i], "lymphocyte") for i in pick]
            other += [pbc_abn[i] for i in rng.choice(len(pbc_abn), n_abn, replace=False)]
            slides = {"same lab (Matek)": same, "other lab (PBC)": other}
            info = {
                "normalization": calibrate.conformal.DEFAULT_NORMALIZATION,
                **calibrate.leave_one_slide_out(parts),
            }
            cal = calibrate.Calibration(parts, info)
            for name, cells in slides.items():
                s = scores(name.split()[0], cells)
                labels = np.array([c not in ("LYT", "lymphocyte") for _, c in cells])
                b = calibrate.apply(s, cal)["burden"]
                rows.append(
                    {
                        "seed": seed,
                        "slide": name,
                        "cells": len(cells),
                        "abnormal": int(labels.sum()),
                        "status": b["status"],
                        **{f"dev_{k}": v for k, v in b["bulk_deviation"].items()},
                        **{f"tol_{k}": v for k, v in b["bulk_tolerance"].items()},
                        "burden": b.get("abnormal_cells"),
                        "flagged": b.get("flagged_bh"),
                    }
                )
                print(rows[-1])
    meta = {**machine(), "seconds": round(time.perf_counter() - t0, 1), "wr": args.wr}
    md = [
        "# The calibration's bulk check across labs (real cells)",
        "",
        f"`python benchmarks/burden/burden_cross_lab.py --bone-marrow {args.bone_marrow} --pbc "
        f"{args.pbc} --seeds {args.seeds} --results {args.results}` on {meta['host']} "
        f"({meta['cpu_count']} CPUs), {meta['seconds']} s. Deep SVDD fast preset trained on half "
        f"of the Matek lymphocytes; {args.groups} calibration groups of {args.group} held-out "
        f"lymphocytes; two test sets of {args.group * 2} normal cells + abnormal cells at WR "
        f"{args.wr}. dev/tol: the bulk check's deviations and tolerances (median shift in "
        "calibration IQRs, log ratio of IQRs).",
        "",
    ]
    cols = [(k, k) for k in rows[0]] if rows else []
    md += markdown_table(rows, cols)
    for name in ("same lab (Matek)", "other lab (PBC)"):
        sel = [r for r in rows if r["slide"] == name]
        md += [
            "",
            f"- {name}: called a mismatch on {sum(r['status'] != 'ok' for r in sel)}/{len(sel)} "
            f"seeds; median shift {mean_sd([r['dev_median_shift_iqr'] for r in sel], '{:.2f}')} "
            "IQRs",
        ]
    write(args.results, "burden_cross_lab", meta, rows, md)


if __name__ == "__main__":
    main()
