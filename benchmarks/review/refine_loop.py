"""One round of expert-in-the-loop refinement (issue 17): does it raise Recall@K on slides the
review never saw?

Per seed (nothing here was tuned: eta = 1 is Deep SAD's default, `--agree any`, K = 100 as in the
paper's review, and the reviewer's error rates are fixed before the first run):
1. synthetic normal cell patches -> Deep SVDD, fast preset (as `make demo`), exported to ONNX;
2. REVIEW synthetic slides (4096^2, 2% planted abnormal cells) scored by the pipeline with ground
   truth; a review of their top-100 cells is built (`cyto review`'s folder);
3. a simulated reviewer marks each truly abnormal cell with probability 1 - MISS and each normal
   cell with probability FALSE_MARK, and finishes every case;
4. `cyto refine --retrain` retrains the model with those marks (hard normals + Deep SAD), and
   exports it (`--finetune`, the default since, is measured by the variant of that name);
5. HELD held-out slides (other seeds; never reviewed) are scored by both models: Recall@100 of
   the planted abnormal cells, and its paired difference.

    python benchmarks/review/refine_loop.py --seeds 0,1,2,3,4 \\
        --results benchmarks/results/vm-2core/refine

Each seed's result is kept in WORK/seedN.json, so a rerun continues. `--ablation` then takes
each finished seed's base model and review and refines with eta = 0 (the hard normals alone, no
known abnormal cells), scoring the same held-out slides: which half of the loop does the work.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _results.py
from _results import machine, mean_sd, write  # noqa: E402

MISS, FALSE_MARK = 0.1, 0.02
SIDE, WR, K = 4096, 0.02, 100
N_TRAIN = 200  # normal training cells of the base model
CROP = 192  # the model's view on these slides (0.12 um/px, the patches' size)


def negative_slide_cells(out: Path, seed: int, n: int) -> list[Path]:
    """``n`` normal training cells as a lab would collect them (`cyto data cells` on a scored
    negative slide): crops of the cells of a synthetic slide with no abnormal cell, centred where
    its cells are (the truth table: no model needed yet), at the model's view, in
    ``out/normal/``."""
    import pyarrow.parquet as pq

    from cyto.data.synth.slide import SlideSynthConfig, write_slide
    from cyto.review.session import crop_cells

    (out / "normal").mkdir(parents=True, exist_ok=True)
    made = write_slide(
        out / "negative.ndpi",
        SlideSynthConfig(width=SIDE, height=SIDE, abnormal_fraction=0.0, seed=1000 * seed + 900),
        overwrite=True,
    )
    gt = pq.read_table(made.ground_truth)
    x, y = np.asarray(gt["x"]), np.asarray(gt["y"])
    inside = (x >= CROP / 2) & (y >= CROP / 2) & (x < SIDE - CROP / 2) & (y < SIDE - CROP / 2)
    pick = np.sort(np.random.default_rng([seed, 9]).choice(np.flatnonzero(inside), n, False))
    rows = [out / "normal" / f"cell{j:05d}.png" for j in pick]
    crop_cells(made.paths[0], [(x[j], y[j]) for j in pick], CROP, rows)
    return rows


def _score(slide, model, out, truth):
    from cyto.infer import ScoreOptions, score_slide

    return score_slide(
        slide, model, out, ScoreOptions(top_k=K, mosaic=0, truth=truth), echo=lambda _: None
    )


def one_seed(
    seed: int, work: Path, n_review: int, n_held: int, train_cells: str = "patches"
) -> dict:
    from cyto.data.synth.cells import DEFAULT_SCALE, MPP_AT_SCALE_1
    from cyto.data.synth.patches import PatchSynthConfig, write_patches
    from cyto.data.synth.slide import SlideSynthConfig, write_slide
    from cyto.export.api import export_bundle
    from cyto.review.refine import refine
    from cyto.review.session import build_session
    from cyto.review.store import MarkStore
    from cyto.train.api import train

    t0 = time.perf_counter()
    w = work / f"seed{seed}"
    patches = w / "patches"
    if train_cells == "slides":
        rows = negative_slide_cells(patches, seed, N_TRAIN)
    else:
        config = PatchSynthConfig(n_normal=N_TRAIN, n_abnormal=0, seed=seed)
        write_patches(patches, config, overwrite=True)
        rows = sorted(p for p in patches.rglob("*") if p.is_file())
    (w / "train.csv").write_text(
        "path,label\n" + "".join(f"{p.resolve()},{p.parent.name}\n" for p in rows)
    )
    mpp = round(MPP_AT_SCALE_1 / DEFAULT_SCALE, 4)
    base = train(
        "dsvdd",
        w / "train.csv",
        w / "base.cyto",
        normal="normal",
        preset="fast",
        overrides={"seed": seed, "mpp": mpp},
        device="cpu",
        overwrite=True,
    ).bundle
    export_bundle(base, echo=lambda _: None)

    def slides(kind: str, n: int, offset: int):
        (w / f"slides_{kind}").mkdir(parents=True, exist_ok=True)
        return [
            write_slide(
                w / f"slides_{kind}" / f"{kind}{i}.ndpi",
                SlideSynthConfig(
                    width=SIDE, height=SIDE, abnormal_fraction=WR, seed=1000 * seed + offset + i
                ),
                overwrite=True,
            )
            for i in range(n)
        ]

    review_slides = slides("review", n_review, 100)
    for s in review_slides:
        _score(s.paths[0], base, w / "review_scored" / s.paths[0].stem, s.ground_truth)
    session = build_session(
        [w / "review_scored"], w / "review", k=K, seed=seed, echo=lambda _: None
    )
    rng = np.random.default_rng([seed, 17])
    store = MarkStore(session.root)
    truth_marks = {"abnormal_shown": 0, "abnormal_marked": 0, "normal_marked": 0}
    for case in session.case_ids():
        for c in session.key["cases"][case]["cells"]:
            abnormal = c["label"] == 1
            p = 1 - MISS if abnormal else FALSE_MARK
            marked = bool(rng.random() < p)
            truth_marks["abnormal_shown"] += int(abnormal)
            truth_marks["abnormal_marked"] += int(abnormal and marked)
            truth_marks["normal_marked"] += int(marked and not abnormal)
            if marked:
                store.mark("sim", case, c["position"], True)
        store.set_done("sim", case, True)
    store.close()
    res = refine(
        base,
        session.root,
        w / "train.csv",
        w / "refined.cyto",
        device="cpu",
        overwrite=True,
        echo=lambda _: None,
        finetune=False,
    )
    export_bundle(Path(res["bundle"]), echo=lambda _: None)

    held = []
    for s in slides("held", n_held, 500):
        row = {"slide": s.paths[0].name, "planted": s.n_abnormal}
        for name, model in (("base", base), ("refined", Path(res["bundle"]))):
            summary = _score(
                s.paths[0], model, w / f"held_{name}" / s.paths[0].stem, s.ground_truth
            )
            row[f"{name}_found"] = summary["truth"]["planted_found_in_top_k"]
            row[f"{name}_recall"] = summary["truth"]["planted_recall_at_k"]
        held.append(row)
    out = {
        "seed": seed,
        "review": truth_marks,
        "hard_normals": res["hard_normals"],
        "known_abnormal": res["known_abnormal"],
        "held": held,
        "base_recall": float(np.mean([h["base_recall"] for h in held])),
        "refined_recall": float(np.mean([h["refined_recall"] for h in held])),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    out["delta_recall"] = out["refined_recall"] - out["base_recall"]
    return out


def _rerefine(seed: int, work: Path, name: str, held: str, **how) -> tuple[dict, float]:
    """Refine a finished seed's base model from its review again (``how``: refine's options),
    export it and score the seed's held-out slides: (the seed's first result, mean Recall)."""
    from cyto.export.api import export_bundle
    from cyto.review.refine import refine

    w = work / f"seed{seed}"
    first = json.loads((work / f"seed{seed}.json").read_text())
    how.setdefault("finetune", False)  # as the seed's first refinement, unless asked
    res = refine(
        w / "base.cyto",
        w / "review",
        w / "train.csv",
        w / f"{name}.cyto",
        device="cpu",
        overwrite=True,
        echo=lambda _: None,
        **how,
    )
    export_bundle(Path(res["bundle"]), echo=lambda _: None)
    recalls = []
    for h in first["held"]:
        slide = w / "slides_held" / h["slide"]
        truth = slide.with_name(slide.stem + ".cells.parquet")
        summary = _score(slide, Path(res["bundle"]), w / held / slide.stem, truth)
        recalls.append(summary["truth"]["planted_recall_at_k"])
    return first, float(np.mean(recalls))


def hard_normals_only(seed: int, work: Path) -> dict:
    """The same refinement with eta = 0: Deep SVDD on the hard normals, marks unused."""
    first, recall = _rerefine(seed, work, "hard_normals", "held_hn", eta=0.0)
    return {
        "seed": seed,
        "base_recall": first["base_recall"],
        "hard_normals_only_recall": recall,
        "refined_recall": first["refined_recall"],
    }


def _against_base(seed: int, work: Path, name: str, held: str, **how) -> dict:
    """A re-refinement's mean Recall (``NAME_recall``) beside the seed's base and default
    refinement, and its gain over the base (``delta_NAME``)."""
    first, recall = _rerefine(seed, work, name, held, **how)
    return {
        "seed": seed,
        "base_recall": first["base_recall"],
        f"{name}_recall": recall,
        "refined_recall": first["refined_recall"],
        f"delta_{name}": recall - first["base_recall"],
    }


def finetuned(seed: int, work: Path) -> dict:
    """The same review, refined by fine-tuning the base model (``cyto refine --finetune``)."""
    return _against_base(seed, work, "finetuned", "held_ft", finetune=True)


def known_only(seed: int, work: Path) -> dict:
    """The same review, refined from the marked cells alone (``cyto refine --no-hard-normals``:
    Deep SAD on the training normals plus the known abnormal cells)."""
    return _against_base(seed, work, "known_only", "held_ko", hard_normals=False)


def _suffix(a) -> str:
    return "" if a.train_cells == "patches" else f"_{a.train_cells}-cells"


def variant(a, name: str, run, cols: tuple[str, ...], title: str, header: str) -> None:
    """A variant of the refinement on each finished seed's base model, review and held slides."""
    rows = []
    for seed in [int(s) for s in a.seeds.split(",")]:
        done = a.work / f"seed{seed}_{'hard_normals' if name == 'ablation' else name}.json"
        if not done.is_file():
            if not (a.work / f"seed{seed}.json").is_file():
                one = one_seed(seed, a.work, a.review_slides, a.held_slides, a.train_cells)
                (a.work / f"seed{seed}.json").write_text(json.dumps(one, indent=1))
            done.write_text(json.dumps(run(seed, a.work), indent=1))
        rows.append(json.loads(done.read_text()))
        print(rows[-1], flush=True)
    flag = "--ablation" if name == "ablation" else f"--{name}"
    cells = "" if a.train_cells == "patches" else f" --train-cells {a.train_cells}"
    meta = {
        **machine(),
        "command": f"python benchmarks/review/refine_loop.py --seeds {a.seeds} {flag}{cells}",
    }
    md = [
        f"# {title} ({len(rows)} seeds)",
        "",
        f"`{meta['command']}` on {meta['host']}; the same base models, reviews and held-out "
        "slides as refine_loop.",
        "",
        header,
        "|---" * (len(cols) + 1) + "|",
        *[f"| {r['seed']} | " + " | ".join(f"{r[c]:.3f}" for c in cols) + " |" for r in rows],
        "",
        "mean ± sd: " + ", ".join(f"{c} {mean_sd([r[c] for r in rows])}" for c in cols),
    ]
    delta = {"finetune": "delta_finetuned", "known-only": "delta_known_only"}.get(name)
    if delta:
        d = [r[delta] for r in rows]
        md.append(f"{name} above base on {sum(x > 0 for x in d)}/{len(d)} seeds")
    write(a.results, f"refine_{name}{_suffix(a)}", meta, rows, md)
    print("\n".join(md))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--review-slides", type=int, default=2)
    ap.add_argument("--held-slides", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path("/tmp/cyto-refine-loop"))
    ap.add_argument("--results", type=Path, required=True)
    ap.add_argument("--ablation", action="store_true", help="eta 0 on the finished seeds")
    ap.add_argument(
        "--finetune",
        action="store_true",
        help="refine each seed by fine-tuning the base model (cyto refine --finetune); seeds "
        "not yet run get the whole loop first",
    )
    ap.add_argument(
        "--known-only",
        action="store_true",
        help="refine each seed from the marked cells alone (cyto refine --no-hard-normals)",
    )
    ap.add_argument(
        "--train-cells",
        choices=("patches", "slides"),
        default="patches",
        help="the base model's normal training cells: synthetic cell patches (as make demo), or "
        "crops of the cells of a negative synthetic slide, as a lab collects them (use another "
        "--work folder for each)",
    )
    a = ap.parse_args()
    if a.known_only:
        cols = ("base_recall", "known_only_recall", "refined_recall", "delta_known_only")
        return variant(
            a,
            "known-only",
            known_only,
            cols,
            "Refinement from the marked cells alone vs marked cells + hard normals",
            "| seed | Recall@100 base | marked cells only | + hard normals (refine_loop) | "
            "marked only - base |",
        )
    if a.ablation:
        return variant(
            a,
            "ablation",
            hard_normals_only,
            ("base_recall", "hard_normals_only_recall", "refined_recall"),
            "Refinement ablation: hard normals alone vs hard normals + Deep SAD",
            "| seed | Recall@100 base | hard normals only (eta 0) | + known abnormal (eta 1) |",
        )
    if a.finetune:
        cols = ("base_recall", "finetuned_recall", "refined_recall", "delta_finetuned")
        return variant(
            a,
            "finetune",
            finetuned,
            cols,
            "Refinement by fine-tuning the base model vs retraining",
            "| seed | Recall@100 base | fine-tuned | retrained (refine_loop) | fine-tuned - base |",
        )
    seeds = [int(s) for s in a.seeds.split(",")]
    rows = []
    for seed in seeds:
        done = a.work / f"seed{seed}.json"
        if done.is_file():
            rows.append(json.loads(done.read_text()))
            continue
        r = one_seed(seed, a.work, a.review_slides, a.held_slides, a.train_cells)
        done.parent.mkdir(parents=True, exist_ok=True)
        done.write_text(json.dumps(r, indent=1))
        rows.append(r)
        print(
            f"seed {seed}: Recall@{K} base {r['base_recall']:.3f} -> refined "
            f"{r['refined_recall']:.3f} ({r['hard_normals']} hard normals, "
            f"{r['known_abnormal']} known abnormal; {r['seconds']:.0f} s)",
            flush=True,
        )
    base = [r["base_recall"] for r in rows]
    ref = [r["refined_recall"] for r in rows]
    delta = [r["delta_recall"] for r in rows]
    better = sum(d > 0 for d in delta)
    meta = {
        **machine(),
        "command": "python benchmarks/review/refine_loop.py "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(a).items() if k != "work"),
        "reviewer": {"miss": MISS, "false_mark": FALSE_MARK},
        "slides": {
            "side": SIDE,
            "witness_rate": WR,
            "review": a.review_slides,
            "held_out": a.held_slides,
        },
        "k": K,
    }
    md = [
        f"# One round of expert-in-the-loop refinement ({len(rows)} seeds)",
        "",
        f"`{meta['command']}` on {meta['host']} ({meta['cpu_count']} CPUs)",
        "",
        f"Deep SVDD fast preset on {N_TRAIN} normal cells ("
        + ("synthetic patches" if a.train_cells == "patches" else "crops of a negative slide")
        + f"); review of {a.review_slides} slide(s) x top-{K}; simulated "
        f"reviewer: misses {MISS:.0%} of abnormal cells, marks {FALSE_MARK:.0%} of normal ones; "
        f"{a.held_slides} held-out slide(s) per seed ({SIDE}^2 px, {WR:.0%} planted abnormal).",
        "",
        "| seed | hard normals | known abnormal | Recall@100 base | refined | difference |",
        "|---|---|---|---|---|---|",
        *[
            f"| {r['seed']} | {r['hard_normals']} | {r['known_abnormal']} | "
            f"{r['base_recall']:.3f} | {r['refined_recall']:.3f} | {r['delta_recall']:+.3f} |"
            for r in rows
        ],
        "",
        f"mean ± sd over seeds: base {mean_sd(base)}, refined {mean_sd(ref)}, paired difference "
        f"{mean_sd(delta)}; refined higher on {better}/{len(rows)} seeds.",
    ]
    write(a.results, f"refine_loop{_suffix(a)}", meta, rows, md)
    print("\n".join(md))


if __name__ == "__main__":
    main()
