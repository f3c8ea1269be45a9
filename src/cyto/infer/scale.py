"""A slide's scale against the model's: the recorded resolutions (before the first tile) and the
cells' own size (the first tiles' centre-nucleus share, :mod:`cyto.data.scale`), said in one
voice: advice on the resolution's word alone is conditional, and the cells' check says which
resolution is in doubt (the file's recorded, or a ``--mpp`` given over it)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cyto.errors import ScaleWarning, warning_echo
from cyto.flags import UM_PER_PX, passing, said, to_pass
from cyto.infer.options import DEFAULT_PATCH, patch_side


@dataclass(frozen=True)
class Resolution:
    """The slide's and the model's resolution, and the crop size that follows at level 0."""

    slide_mpp: float | None
    model_mpp: float | None
    objective: float | None
    crop_px_level0: int
    mpp_ratio: float | None = None
    # what the slide's file records, where --mpp was given otherwise (more than 10 % apart)
    recorded_mpp: float | None = None

    def as_json(self) -> dict:
        out = {
            "slide_mpp": self.slide_mpp,
            "model_mpp": self.model_mpp,
            "objective": self.objective,
            "crop_px_level0": self.crop_px_level0,
        }
        if self.mpp_ratio is not None:
            out["mpp_ratio"] = self.mpp_ratio
        if self.recorded_mpp is not None:  # a file's float32 said as written (0.258)
            out["recorded_mpp"] = round(self.recorded_mpp, 6)
        return out


def resolution(
    slide_mpp: float | None,
    objective: float | None,
    model_mpp: float | None,
    patch: int,
    rescale: bool,
    echo,
    recorded_mpp: float | None = None,
    cells_checked: bool = False,
) -> Resolution:
    """The level-0 crop size, after comparing the slide's mpp with the model's training mpp.
    ``recorded_mpp``: the slide file's own, where ``slide_mpp`` was given otherwise (said).
    ``cells_checked``: the first tiles' cells will be checked against it (:func:`check_scale`),
    and the advice says a verdict follows."""
    echo = warning_echo(echo, ScaleWarning)
    src, ratio = patch, None
    if recorded_mpp and slide_mpp and abs(slide_mpp / recorded_mpp - 1.0) > 0.1:
        # a given mpp that contradicts the file's is said once, and named again by the scale
        # check where the cells' size doubts it (hostile round 21, case 2.5)
        echo(
            f"note: {passing('slide_mpp', slide_mpp)} is taken over the {recorded_mpp:.3g} "
            "um/px the slide's file records"
        )
    else:
        recorded_mpp = None
    if model_mpp and slide_mpp:
        ratio = round(model_mpp / slide_mpp, 4)
        if abs(ratio - 1.0) > 0.1:
            if rescale:
                src = max(16, int(round(patch * ratio)))
                echo(
                    f"note: slide at {slide_mpp:.3g} um/px, model trained at {model_mpp:.3g}: "
                    f"cutting {src} px crops and resampling them to {patch}"
                )
            else:
                # how many times, said as the scale check says it ("0.00x" beside "416.67x
                # smaller": hostile round 11, N30)
                times = ratio if ratio > 1 else 1.0 / ratio
                # resampling that would cut crops under 16 px, or 8x the patch, cannot help
                helps = 16 <= patch * ratio <= 8 * patch
                # a given resolution over the file's own, which is the model's: the other way
                # out, said here too (the cells' check then refused --rescale: round 21's
                # two warnings, the first advising what the second refused)
                own = recorded_mpp and abs(recorded_mpp / model_mpp - 1.0) <= 0.1
                own_words = (
                    f"; its file records {recorded_mpp:.3g} um/px, the model's own: if that is "
                    f"right, leave out {said('slide_mpp')}"
                    if own
                    else ""
                )
                # advice on the resolution's word alone: the cells' own size, checked on the
                # first tiles, can say it is wrong (then --rescale is not to be passed: hostile
                # round 21, case 2.4, was told both)
                echo(
                    f"warning: slide at {slide_mpp:.3g} um/px but the model was trained at "
                    f"{model_mpp:.3g} um/px; cells will look {times:.3g}x "
                    f"{'larger' if ratio > 1 else 'smaller'} than in training. "
                    + (
                        f"If {slide_mpp:.3g} um/px is its true resolution, pass "
                        f"{passing('rescale')} to resample the crops"
                        # the cells' check may then say the resolution is wrong: the advice
                        # waits on it in words (two warnings read as opposite advice: hostile
                        # round 73, 5)
                        + (
                            "; the first tiles' cells, checked against it, say whether it is"
                            if cells_checked
                            else ""
                        )
                        if helps
                        else "No resampling bridges that: check that this is a slide and its "
                        f"pixel size ({said('slide_mpp')})"
                    )
                    + own_words
                )
    elif rescale:
        todo = to_pass(
            {"slide_mpp": slide_mpp, "model_mpp": model_mpp},
            ("slide_mpp", UM_PER_PX),
            ("model_mpp", UM_PER_PX),
        )
        echo(
            f"warning: {said('rescale')} needs the mpp of both the slide and the model "
            f"(slide: {slide_mpp}, model: {model_mpp}); crops are not resampled: pass {todo}"
        )
    return Resolution(slide_mpp, model_mpp, objective, src, ratio, recorded_mpp)


def detection_cause(scorer, opts) -> str | None:
    """Where ``--detection`` is not the detection of the model's stain, what that does and what
    to do, said before any other cause by the scale and the stain checks alike (the MGG preset
    on Pap cells takes their cytoplasm for nucleus: hostile round 18; a Pap slide of the
    model's own lab was told to train on "this lab's" cells: round 25); else None."""
    from cyto.detect.params import DETECTION_OF_STAIN

    stain = scorer.spec.stain
    model_kind = DETECTION_OF_STAIN.get(stain)
    if not model_kind or opts.detection.kind == model_kind:
        return None
    said_so = (
        f"{passing('detection', opts.detection.kind)} is not the detection of the model's "
        f"{stain}-stained training cells ({model_kind}): it finds and measures their nuclei "
        f"otherwise; "
    )
    if opts.detection.kind == "tissue" and model_kind != "tissue":
        # chosen for a section, as the crowding check advises: leaving it out (smear) was said
        # of an H&E section the crowding check had told to pass it (hostile round 75, 3)
        return (
            said_so + f"if the slide is a smear, leave out {said('detection')} (auto takes "
            f"{model_kind}); if a section, the model never saw a section's cells: train one on "
            "normal cells of such slides"
        )
    return said_so + f"leave out {said('detection')} (auto takes {model_kind})"


def check_scale(
    shares: list[np.ndarray], plan, scorer, opts, echo, stain: dict | None = None
) -> dict | None:
    """With the crowding check: say when the first tiles' cells look more than
    :data:`~cyto.data.scale.ADVISE_ZOOM` times smaller or larger than the model's training
    cells (the median share of the crop taken by its centre nucleus, against the bundle's),
    which a wrong or missing mpp gives. Said beside the crowding warning too (cells 0.6x the
    model's size at its stated mpp crowd a crop: 8 others), where it tells a misstated mpp from a
    tissue section; not said under ``--detection tissue``, whose nuclei touch. None when the
    bundle records no training share."""
    from cyto.data.scale import ADVISE_ZOOM, cells_words, look_words, share_check
    from cyto.detect.params import DETECTION_OF_STAIN

    echo = warning_echo(echo, ScaleWarning)
    model = scorer.spec.centre_nucleus_fraction
    check = share_check(model, np.concatenate(shares)) if model is not None and shares else None
    if check is None:
        return None
    check["advised"] = bool(check["advised"] and opts.detection.kind in ("smear", "pap"))
    if stain and stain.get("advised") and detection_cause(scorer, opts) is None:
        # the stain check (:func:`_check_stain`, before this) says another stain: the nucleus
        # mask reads its cells otherwise, so their size doubts no resolution (an MGG model on a
        # Pap slide at its right 0.258 um/px was told it was "likely wrong": round 58, 2)
        check["stained_otherwise"], check["advised"] = True, False
        if check["factor"] is not None and not 1 / ADVISE_ZOOM <= check["factor"] <= ADVISE_ZOOM:
            echo(
                f"note: the cells of {plan.slide.name} {look_words(check)}, but they are "
                "stained otherwise than the model's training cells, so their size says "
                "nothing of the slide's resolution"
            )
        return check
    res = plan.res
    ratio = None if opts.rescale else res.mpp_ratio  # the model's mpp over the slide's
    judged = ratio is not None and opts.detection.kind in ("smear", "pap")
    judged = judged and check["factor"] is not None
    # the recorded resolutions put the cells past what the check would have said
    far = judged and not (
        1 / doubted_past(scorer.spec.stain, False) <= ratio <= doubted_past(scorer.spec.stain, True)
    )
    # off the model's scale by the resolution (past the check's own bound), while the cells
    # read the other way (a --mpp 0.2 for 0.258: 1.29x larger by it, 1.13x smaller as read:
    # round 34, 3); a true 0.2 slide reads weakly larger, never smaller
    other_way = judged and check["factor"] != 1 and (ratio > 1) == (check["factor"] > 1)
    off = judged and not 1 / ADVISE_ZOOM <= ratio <= ADVISE_ZOOM
    within = judged and 1 / ADVISE_ZOOM <= check["factor"] <= ADVISE_ZOOM
    # every median the cells allow within the bound, with the check's confidence: "as the
    # model's" (the median alone within it doubted a true 0.18 um/px Pap slide, read 1.22-1.29x
    # of a true 1.43x: hostile round 24)
    if far and check.get("sure_within"):
        # the recorded resolutions say the cells look another size; they look as the model's
        check["mpp_contradicted"] = True
        times, how = (ratio, "larger") if ratio > 1 else (1 / ratio, "smaller")
        # the warning before the first tiles advised --rescale on the resolution's word: this
        # one says not to (hostile round 21, case 2.4), and names a given --mpp as the suspect
        whose = (
            f"{passing('slide_mpp', opts.slide_mpp)}"
            + (f" (its file records {res.recorded_mpp:.3g})" if res.recorded_mpp else "")
            if opts.slide_mpp
            else f"its recorded {res.slide_mpp:.3g} um/px"
        )
        echo(
            f"warning: the cells of {plan.slide.name} look as the model's training cells "
            f"(median nucleus share {check['median_nucleus_share']:.3f} of "
            f"{cells_words(check['cells'])} against {check['model_nucleus_share']:.3f}), though "
            f"{whose} against the model's {res.model_mpp:.3g} um/px would make them "
            f"{times:.3g}x {how}: that resolution is likely wrong. They are scored as they "
            f"look, not resampled ({said('rescale')} would put them off scale), but found and "
            f"measured at it (the um^2 columns, cells.geojson: a wrong size); if they are at "
            f"the model's, score again with {passing('slide_mpp', res.model_mpp)}"
        )
    elif within and (far or (off and other_way)):
        # the median within the bound, not surely: too weak to doubt the resolution, said as a
        # note (a --mpp 0.4 given for 0.258 made the slide "0 evaluable" with no word that the
        # cells read 1.16x: hostile round 33, 7)
        times, how = (ratio, "larger") if ratio > 1 else (1 / ratio, "smaller")
        given = (
            passing("slide_mpp", opts.slide_mpp)
            if opts.slide_mpp
            else f"its recorded {res.slide_mpp:.3g} um/px"
        )
        echo(
            f"note: the cells of {plan.slide.name} {look_words(check)}: nearer the model's "
            f"training cells than {given} would make them ({times:.3g}x {how})"
            + (", and the other way" if other_way else "")
            + ("" if check.get("sure_within") else ", though too few or too scattered to be sure")
            + f"; if that resolution is wrong, pass {passing('slide_mpp', res.model_mpp)}"
        )
    # a --patch-size other than the model's cuts its cells at another scale (a crop half the
    # side shows cells twice as large): that, not the slide's mpp, is then the cause
    own = scorer.spec.patch_px or DEFAULT_PATCH
    cut = opts.patch_size / own if opts.patch_size else 1.0
    # a --detection other than the one of the model's stain finds and measures nuclei otherwise
    # (the MGG preset on Pap cells takes their cytoplasm for nucleus): that is said first, not
    # the slide's resolution, which its advice would then make wrong (hostile round 18)
    differs = detection_cause(scorer, opts)
    if check["advised"] and differs is not None:
        model_kind = DETECTION_OF_STAIN[scorer.spec.stain]
        check["detection_differs"] = {"detection": opts.detection.kind, "model": model_kind}
        echo(f"warning: the cells of {plan.slide.name} {look_words(check)}: {differs}")
    elif check["advised"] and cut != 1 and (cut < 1) == (check["factor"] < 1):
        check["cut_by"] = {"patch_size": opts.patch_size, "model_patch_size": own}
        echo(
            f"warning: the cells of {plan.slide.name} {look_words(check)}: "
            f"{passing('patch_size', opts.patch_size)} cuts crops {cut:.2g}x the side of the "
            f"model's ({own} px), so its cells look {1 / cut:.2g}x as large as it saw them; "
            f"leave out {said('patch_size')} to cut crops as the model was trained"
        )
    elif check["advised"] and check["factor"] < 1 and crops_at_model_mpp(res, opts):
        # larger nuclei at a resolution the slide records as the model's: enlarged nuclei are
        # what a lesion is, and the nucleus share cannot tell them from a wrong resolution (an
        # all-LSIL slide read 1.76x, a slide 3x off 1.81x: hostile rounds 20 and 21); the cells
        # stay off scale (the slide is read by eye), and --rescale is not advised blindly: it
        # would shrink enlarged nuclei back
        check["larger_at_recorded_mpp"] = True
        fix = (
            f"check {passing('slide_mpp', opts.slide_mpp)}"
            + (
                f": the slide's file records {res.recorded_mpp:.3g} um/px"
                if res.recorded_mpp
                else ""
            )
            if opts.slide_mpp
            else f"pass its true {passing('slide_mpp', UM_PER_PX)}"
            + ("" if opts.rescale else f" and {passing('rescale')}")
        )
        ratio = res.mpp_ratio or 1.0
        at = (
            # resampled by the resolutions: "puts them at the model's scale" read as false
            # where the slide's is far from the model's (hostile round 21, case 2.5)
            f"resampled from its resolution ({res.slide_mpp:.3g} um/px) to the model's "
            f"({res.model_mpp:.3g}), they should be at the model's scale"
            if opts.rescale and not 1 / ADVISE_ZOOM <= ratio <= ADVISE_ZOOM
            else f"its resolution ({res.slide_mpp:.3g} um/px, the model's "
            f"{res.model_mpp:.3g}) puts them at the model's scale"
        )
        if opts.rescale and ratio < 1 / ADVISE_ZOOM:
            # resampling enlarged them: without it they may be at the model's (case 2.4)
            at += f" (resampling enlarged them {1 / ratio:.3g}x)"
        echo(
            f"warning: the cells of {plan.slide.name} {look_words(check)}, though {at}: nuclei "
            "enlarged in most of its cells look so (a lesion-rich specimen: LSIL or HSIL on a "
            "Pap slide, blasts in marrow), and so does a wrong resolution, which this check "
            "cannot tell apart; its cells are held off scale (unless most are out of focus or "
            "crowded, which look larger too), so read the slide by eye. Only if "
            f"{res.slide_mpp:.3g} um/px is not its true resolution, {fix} (resampled at its "
            "right resolution, enlarged nuclei would shrink back)"
        )
    elif check["advised"]:
        reading = f"It is read at {res.slide_mpp:.3g} um/px" if res.slide_mpp else "It has no mpp"
        if res.recorded_mpp:  # a given --mpp the file contradicts (hostile round 21, case 2.5)
            reading += f" (its file records {res.recorded_mpp:.3g})"
        agree = False
        if res.model_mpp:
            # the crop's pixels are factor x the size the model expects
            est = (
                res.model_mpp * check["factor"] * patch_side(opts, scorer.spec) / res.crop_px_level0
            )
            reading += f"; its cells look as if at about {est:.2g}"
            # the cells agree with the recorded resolution: resampling is what is left, not a
            # question of the resolution (T04 at 0.4 was asked "is its resolution right? ... as
            # if at about 0.4": hostile round 24)
            agree = bool(
                res.slide_mpp and not opts.rescale and abs(est / res.slide_mpp - 1) <= 0.15
            )
        # what is left to pass: the slide's true mpp, the model's where the bundle lacks it, and
        # --rescale; all given (crops resampled from them), the slide's mpp given is in doubt
        todo = to_pass(
            opts,
            ("slide_mpp", UM_PER_PX),
            *((("model_mpp", UM_PER_PX),) if not res.model_mpp else ()),
            ("rescale", True),
        )
        check["to_pass"] = todo  # for the adequacy rule's reason (None: all were given)
        fix = (
            f"Pass {todo} to resample the crops to the model's scale"
            if todo
            else f"If {passing('slide_mpp', opts.slide_mpp)} is not its true um/px, pass that"
        )
        if agree:
            fix = f"Pass {passing('rescale')} to resample the crops to the model's scale"
        ask = "its recorded resolution says so too." if agree else "is its resolution right?"
        echo(
            f"warning: the cells of {plan.slide.name} {look_words(check)}: {ask} {reading}. "
            f"{fix}; a one-class model can rank cells at another scale as the most abnormal"
        )
    if differs is not None and "detection_differs" not in check:
        # said where the cells' size did not say it (--detection tissue, whose nuclei touch, is
        # not checked by it: a Pap slide found 58 cells of 682 unsaid; hostile round 58, 3)
        check["detection_differs"] = {
            "detection": opts.detection.kind,
            "model": DETECTION_OF_STAIN[scorer.spec.stain],
        }
        if not (stain and stain.get("advised")):  # the stain's warning names it as its cause
            # (said twice, one line after the other: hostile round 67, 9)
            echo(f"warning: {plan.slide.name}: {differs}")
    return check


#: how far a Pap slide's recorded resolution must put its cells off the model's scale, smaller
#: and larger, before cells that look as the model's doubt it: as far as the Pap centre-nucleus
#: share, read on slides, would have said (hostile rounds 22-24): a smaller scale it reads
#: about as it is (truly 1.55x smaller read 1.53x), a larger one weakly (truly 1.29x read 1.09x,
#: 1.43x 1.22-1.29x, 1.61x 1.40x). A file misrecording 0.4 for 0.258 (1.55x smaller) is
#: doubted, one recording 0.16 (1.61x larger) too; a true 0.2 or 0.18 never
PAP_DOUBT_SMALLER, PAP_DOUBT_LARGER = 1.4, 1.5625


def doubted_past(stain: str | None, larger: bool) -> float:
    """How far a slide's recorded resolution must put its cells from the model's scale
    (``larger``: the side where they would look larger) before cells that look as the model's
    make it "likely wrong": as far as the check would then have said them off scale. The MGG
    whole-crop share grows about as an area (:data:`ADVISE_ZOOM` both sides); the Pap
    centre-nucleus share answers a larger scale weakly (:data:`PAP_DOUBT_LARGER`): past
    :data:`ADVISE_ZOOM` alone, a slide truly at 0.2 um/px was told its resolution was likely
    wrong and not to resample (hostile round 22)."""
    from cyto.data.scale import ADVISE_ZOOM

    if stain in (None, "mgg"):
        return ADVISE_ZOOM
    return PAP_DOUBT_LARGER if larger else PAP_DOUBT_SMALLER


def crops_at_model_mpp(res, opts) -> bool:
    """The slide's and the model's resolutions are both known and the crops are cut at the
    model's scale by them: resampled (``--rescale``) or within
    :data:`~cyto.data.scale.ADVISE_ZOOM` as they are."""
    from cyto.data.scale import ADVISE_ZOOM

    if not res.slide_mpp or not res.model_mpp:
        return False
    return bool(opts.rescale) or 1 / ADVISE_ZOOM <= res.model_mpp / res.slide_mpp <= ADVISE_ZOOM
