"""``cyto refine``: the expert in the loop. Retrain a model with what the reviewers said.

The paper names it as the next step: cells the experts confirmed, and the hard normals among the
top-ranked cells, fed back into the model. From the finished cases of a review:

- a cell no reviewer marked is a *hard normal*: the model ranked it among the most abnormal cells
  of the slide and an expert looked at it and found it normal; it joins the normal training cells;
- a cell marked suspicious (``--agree any``: by any reviewer who finished the case; ``all``: by
  all of them) is a *known abnormal* cell, used where the method allows it: Deep SVDD becomes Deep
  SAD (labelled abnormal cells pushed away from the centre), FS-SIL learns it as abnormal; DROC is
  one-class only and takes the hard normals alone. A cell marked only as ``artifact`` is neither;
- cases no reviewer marked "done" are left out: an unmarked cell there may just not have been
  looked at; so are a reviewer's marks on a case they have not finished. Both are named in the
  line refine prints (:func:`examples_line`).

A Deep SVDD model is fine-tuned by default: its encoders and centres are continued, at a tenth
of its learning rate, without autoencoder pretraining (``--retrain``: train anew). Other methods
are retrained from scratch. Either way the training runs with the bundle's own recorded config
(``--set`` overrides it) on the original training data plus these cells, whose crops are copied
next to the new bundle (``NEW.cyto.refine/``) with the manifest used, so the new bundle's
training data stays on disk. The new manifest's ``refined_from`` records the model, the review,
the cases, the reviewers, the rule and the counts.

Measured (benchmarks/review/refine_loop.py and refine_choice.py: simulated reviewer, Recall@100 on
held-out synthetic slides, base model trained on cells of a negative slide as ``cyto data cells``
cuts them). The mode was chosen on development seeds 0-4 (fine-tuned +0.162 ± 0.066, t 5.5;
retrained +0.140 ± 0.074, t 4.2) and read once on fresh seeds 5-12: fine-tuned +0.085 ± 0.111
(t 2.17, higher on 6/8 seeds), retrained +0.020 ± 0.097 (t 0.58, 4/8). With a base model trained
on synthetic patches neither moved it (+0.019 ± 0.080, +0.006 ± 0.094).
"""

from __future__ import annotations

import csv
import shutil
from pathlib import Path
from typing import Annotated

from cyto.errors import ConfigError
from cyto.flags import Range, check_value, comma_list, passing
from cyto.locks import OutputLock
from cyto.outputs_check import refuse_to_replace
from cyto.review.session import CROPS, open_session
from cyto.review.store import MarkStore
from cyto.tables import json_text

REVIEW_ABNORMAL = "review-marked"
AGREE = ("any", "all")
BAG_METHODS = ("ws-sil", "its2clr")  # bag labels only: a reviewed cell has no bag to join
#: Deep SVDD's Deep SAD weight of the known abnormal cells (its setting ``known_abnormal_eta``)
Eta = Annotated[
    float, Range(0, None, "the Deep SAD weight of the known abnormal cells; 0: they weigh nothing")
]


def review_examples(review: Path, agree: str = "any") -> dict:
    """Hard normals and known abnormal cells from the finished cases of a review."""
    from cyto.flags import check_choice

    check_choice("agree", agree, AGREE)
    session = open_session(review)
    store = MarkStore(session.root, session.session_id)
    try:
        marks, done = store.marks(), store.done()
    finally:
        store.close()
    normals, abnormal, cases = [], [], []
    artifacts = disagreed = 0
    unfinished, not_done = [], {}  # cases nobody finished; marks of a reviewer not finished
    for c in session.cases:
        case = c["case"]
        finished = sorted(r for r, cs in done if cs == case)
        if not finished:
            unfinished.append(case)
            continue
        cases.append({"case": case, "reviewers": finished})
        for r in sorted({r for r, cs, _ in marks if cs == case} - set(finished)):
            not_done.setdefault(r, []).append(case)
        for pos in range(int(c["n"])):
            said = [marks.get((r, case, pos)) for r in finished]
            marked = [m for m in said if m is not None]
            crop = session.root / CROPS / case / f"{pos:03d}.png"
            if not marked:
                normals.append((case, pos, crop))
            elif all(d == "artifact" for _, d in marked):
                artifacts += 1
            elif agree == "any" or len(marked) == len(finished):
                abnormal.append((case, pos, crop))
            else:
                disagreed += 1  # the reviewers disagree and --agree all asks for all
    if not cases:
        raise ConfigError(
            f"{review}: no case is marked done yet; refine uses finished cases only "
            "(press d on a case when its review is complete)"
        )
    return {
        "session": session,
        "hard_normals": normals,
        "known_abnormal": abnormal,
        "excluded": artifacts + disagreed,
        "excluded_artifact": artifacts,
        "excluded_disagreed": disagreed,
        "cases": cases,
        "unfinished_cases": unfinished,
        "marks_not_finished": not_done,
    }


def examples_line(method: str, ex: dict, normals: int, known: int, hard_normals: bool) -> str:
    """What refine takes from the review, and what it leaves out and why, in one line: the
    finished cases, the cells it learns from, the marked cells it does not (each reason
    counted apart), the cases nobody finished and the marks of a reviewer on a case they have
    not finished (named, with what to do)."""
    from cyto.flags import passing

    done = ", ".join(c["case"] for c in ex["cases"])
    line = (
        f"refine {method}: {len(ex['cases'])} finished case(s) ({done}): {normals} hard "
        "normal(s)"
        + (
            ""
            if hard_normals
            else f" (and {len(ex['hard_normals'])} unmarked: {passing('hard_normals', False)})"
        )
        + f", {known} known abnormal cell(s), {ex['excluded_artifact']} cell(s) marked artifact "
        "only left out"
    )
    if ex["excluded_disagreed"]:
        line += (
            f", {ex['excluded_disagreed']} cell(s) marked by some reviewers only left out "
            f"({passing('agree', 'all')})"
        )
    if ex["unfinished_cases"]:
        n, names = len(ex["unfinished_cases"]), ", ".join(ex["unfinished_cases"])
        it = "it" if n == 1 else "them"
        line += (
            f"; {n} unfinished case(s) ({names}) not used: finish {it} in cyto review serve to "
            f"use {'its' if n == 1 else 'their'} marks"
        )
    for who, cs in ex["marks_not_finished"].items():
        it = "it" if len(cs) == 1 else "them"
        line += f"; {who}'s marks on {', '.join(cs)} not used: {who} has not finished {it}"
    return line


def lineage(bundle, depth: int = 32) -> list[str]:
    """The scoring ids of ``bundle`` and of the models it was refined from, newest first (a
    refined model's ``refined_from`` records its parent's id; an older one its path)."""
    from cyto.bundle import load_bundle
    from cyto.errors import CytoError

    ids, manifest = [bundle.scoring_id], bundle.manifest
    for _ in range(depth):
        parent = manifest.get("refined_from") or {}
        if not isinstance(parent, dict) or not parent:
            break
        if parent.get("model_scoring_id"):
            ids.append(str(parent["model_scoring_id"]))
        try:
            up = load_bundle(Path(str(parent.get("model", ""))), weights=False)
        except (CytoError, OSError):
            break
        ids.append(up.scoring_id)
        manifest = up.manifest
    return list(dict.fromkeys(ids))


def check_reviewed_model(bundle, model: Path, review: Path, session) -> None:
    """The review's cells are the top-K of the models it was built from: refining another model
    with them teaches it another model's mistakes as its own. Refused unless ``model`` (by its
    trained arrays, so an exported or calibrated copy counts), or a model it was refined from,
    scored one of its folders."""
    from cyto.review.session import reviewed_models

    made_by = reviewed_models(session)
    if set(lineage(bundle)) & set(made_by.values()):
        return
    if not any(made_by.values()):
        raise ConfigError(
            f"{passing('review', review)}: the scored folders it was built from are gone or do "
            f"not say which model scored them, so it cannot be shown to be a review of MODEL "
            f"{model}"
        )
    raise ConfigError(
        f"{passing('review', review)} is a review of another model's top-K cells (built from "
        f"{', '.join(sorted(made_by))}); MODEL {model} ranked none of them: refine the model "
        "whose cells were reviewed"
    )


def refine(
    model: Path,
    review: Path,
    data: Path,
    out: Path,
    normal: str | None = None,
    abnormal: str | None = None,
    agree: str = "any",
    eta: Eta = 1.0,
    overrides: list[str] | None = None,
    device: str = "auto",
    overwrite: bool = False,
    echo=print,
    finetune: bool | None = None,
    hard_normals: bool = True,
) -> dict:
    """Retrain ``model``'s method on ``data`` plus the review's cells; writes the bundle ``out``.

    ``finetune`` (Deep SVDD; the default for it, ``None``): continue from ``model``'s encoders
    and centres instead of training from scratch, at a tenth of the learning rate it was first
    trained with, without autoencoder pretraining; ``False``: train anew.
    ``hard_normals=False``: learn from the marked cells only; the unmarked reviewed cells are
    not added to the normal training cells."""
    from cyto.bundle import bundle_names, load_bundle
    from cyto.data.dataset import load_records
    from cyto.train.api import train
    from cyto.train.config import ONE_CLASS_ONLY, parse_overrides
    from cyto.train.registry import get_method

    eta = check_value("eta", eta, Eta)  # as given (--eta), not as the setting it becomes
    out = Path(out)
    # before anything is read: OUT replaced MODEL itself, which then named itself as its parent
    refuse_to_replace(
        out,
        overwrite,
        known=bundle_names(out),
        inputs={"MODEL": model, "review": review, "data": data},
    )
    bundle = load_bundle(model, weights=False)
    method = bundle.method
    if finetune is None:
        finetune = method == "dsvdd"
    if method in BAG_METHODS:
        raise ConfigError(
            f"{model} is {method}, trained from bag labels: reviewed cells carry cell labels "
            "and no bag; refine a dsvdd, droc or fs-sil model"
        )
    ex = review_examples(review, agree)
    known = ex["known_abnormal"] if method != "droc" else []
    if method == "droc" and ex["known_abnormal"]:
        echo(
            f"note: droc learns from normal cells only: {len(ex['known_abnormal'])} marked "
            "cell(s) are not used, the hard normals are"
        )
    normals = ex["hard_normals"] if hard_normals else []
    if not normals and not known:
        raise ConfigError(
            "nothing to learn: no known abnormal cell "
            + ("(droc uses none) " if method == "droc" else "")
            + (
                f"and {passing('hard_normals', False)}"
                if not hard_normals
                else "and no hard normal"
            )
        )
    check_reviewed_model(bundle, model, review, ex["session"])
    td = bundle.manifest.get("training_data", {})
    normal_cls = (
        list(comma_list(normal, "normal")) if normal else [c for c in td.get("normal", []) if c]
    )
    if not normal_cls:
        raise ConfigError(f"{model} does not record its normal class: pass --normal")
    abnormal_cls = list(comma_list(abnormal, "abnormal")) if abnormal else None

    work = out.with_name(out.name + ".refine")
    # one refine at a time into OUT: another cleared this one's cells while it trained on them
    with OutputLock(work, "cyto refine"):
        shutil.rmtree(work / "cells", ignore_errors=True)
        (work / "cells").mkdir()
        one_class = get_method(method).one_class
        # a one-class model never learned from DATA's abnormal classes; refining must not start now
        rows = [
            (str(r.path.resolve()), r.cls)
            for r in load_records(data)
            if not one_class or r.cls in normal_cls
        ]
        if not rows:
            raise ConfigError(
                f"{data} holds no image of the normal class(es) {', '.join(normal_cls)}"
            )
        for label, cells in ((normal_cls[0], normals), (REVIEW_ABNORMAL, known)):
            for case, pos, crop in cells:
                dest = work / "cells" / f"{case}_{pos:03d}.png"
                shutil.copyfile(crop, dest)
                rows.append((str(dest.resolve()), label))
        manifest = work / "train.csv"
        with open(manifest, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["path", "label"])
            w.writerows(rows)

        config = dict(bundle.manifest.get("config", {}))
        if not one_class:  # an older cyto recorded them for every method
            for key in ONE_CLASS_ONLY:
                config.pop(key, None)
        if config.get("load_size") is None and rows:
            # the crops' size is the slide's, not the training patches': load all at the latter
            from PIL import Image

            with Image.open(rows[0][0]) as first:
                config["load_size"] = int(first.size[0])
        if method == "dsvdd" and known:
            config["known_abnormal_eta"] = eta
        # MODEL is itself a fine-tuned refinement: its recorded rate is already the tenth
        tuned_before = bool(bundle.manifest.get("refined_from", {}).get("finetune"))
        if finetune:
            if method != "dsvdd":
                raise ConfigError(f"--finetune continues a Deep SVDD model; {model} is {method}")
            config["warm_start"] = str(Path(bundle.path).resolve())
            if not tuned_before:
                config["lr"] = float(config.get("lr", 1e-4)) / 10
        else:
            if config.get("warm_start"):  # anew: not from the model it was tuned from
                config["warm_start"] = ""
            if tuned_before:  # and at the rate it was first trained with
                config["lr"] = float(config["lr"]) * 10
        config.update(parse_overrides(overrides or []))  # --set on top of the recorded config
        provenance = {
            "model": str(Path(bundle.path).resolve()),
            "model_manifest_sha256": bundle.manifest_hash,
            "model_scoring_id": bundle.scoring_id,
            "review": str(ex["session"].root.resolve()),
            "cases": ex["cases"],
            "agree": agree,
            "finetune": finetune,
            "hard_normals": len(normals),
            "hard_normals_left_out": len(ex["hard_normals"]) - len(normals),
            "known_abnormal": len(known),
            "marked_not_used": len(ex["known_abnormal"]) - len(known),
            "excluded": ex["excluded"],
            "unfinished_cases": ex["unfinished_cases"],
            "original_data": str(Path(data).resolve()),
            "training_manifest": str(manifest),
        }
        echo(examples_line(method, ex, len(normals), len(known), hard_normals))
        res = train(
            method,
            manifest,
            out,
            normal=",".join(normal_cls),
            abnormal=None
            if abnormal_cls is None
            else ",".join([*abnormal_cls, REVIEW_ABNORMAL] if known else abnormal_cls),
            overrides=config,
            device=device,
            overwrite=overwrite,
            extra_manifest={"refined_from": provenance},
            mixed_sizes=True,  # the slide crops span the training patches' field of view
        )
        (work / "refined_from.json").write_text(json_text(provenance, indent=1))
        return {**provenance, "bundle": str(res.bundle), "seconds": res.seconds}
