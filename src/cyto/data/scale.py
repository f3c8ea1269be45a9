"""Patches from another scanner or objective, brought to the scale a model was trained at.

A model trained on one lab's cells learns their size: the same lymphocyte imaged at 1.7x fewer
pixels per micron looks like a small, abnormal thing (bone marrow vs peripheral blood: AUROC
0.52 before, 0.87 after). ``zoom`` resamples a patch by a factor about its centre and keeps
its size: > 1 enlarges (centre crop), < 1 shrinks (the border filled with the patch's own
background colour).

The factor comes from the fields of view when the pixel sizes are known
(:func:`field_zoom`: the patches' side in px times their um per pixel, against the model's
training patches'; crops of 200 px at 0.129 um/px show the model's 100 px at 0.258, zoom 1), or
is estimated from the cells: :func:`nucleus_fraction` measures the share of a patch covered by
nucleus, and :func:`zoom_from_nuclei` compares the median over a folder with the median over
the training normals that the bundle records. Where a folder's labels say which cells are
normal, the median is over those alone (:func:`normal_only`: a labelled folder half of
enlarged nuclei looked 1.28x larger than its own training scale); without labels it stands for
the normal cells when most of them are normal (a slide, a screening folder), and a folder
balanced between classes shifts it, which is said where it is used.
"""

from __future__ import annotations

import numpy as np

from cyto.errors import ConfigError
from cyto.flags import FACTOR, UM_PER_PX, check_mpp, passing, said, setting

#: a pixel is nucleus when its optical density (summed over R, G, B) exceeds this share of the
#: patch's own high percentile: stain intensity varies between labs, the nucleus is the darkest
#: part of a blood or marrow cell in both
NUCLEUS_OD_SHARE = 0.5
ZOOM_RANGE = (0.25, 4.0)
#: a folder whose cells look more than this many times smaller or larger than the training cells
#: (from the nuclei) gets a warning that ``--zoom auto`` is advised: another lab's lymphocytes
#: at 1.69x ranked at AUROC 0.44 unzoomed and 0.81 zoomed; the same lab's later files are at 0.9-1.1
ADVISE_ZOOM = 1.25
#: the scale check's confidence that the median of a folder's or a slide's cells is past
#: :data:`ADVISE_ZOOM`: chosen on one lab's later Pap crops (development blocks; 300 draws
#: each, ``benchmarks/results/epyc-2core/pap/scale_rules.txt``): told another scale at the
#: training scale 0.01 / 0 / 0 of draws of 12 / 33 / 64+ cells (the median alone: 0.14 / 0.03 /
#: 0), a median 1.3x off said in 0.47 / 0.83 / 0.95 / 1.00 of draws of 12 / 33 / 64 / 142 (95 %
#: confidence: 0.22 / 0.57 / 0.87 / 0.99). The Pap centre-nucleus share reads a real 1.6x as
#: about 1.3x (hostile round 21): a stricter confidence left such slides unsaid
MEDIAN_CONFIDENCE = 0.80


#: each uint8 channel value's optical density, -log((v + 1) / 256) in float32
_OD_OF = -np.log((np.arange(256, dtype=np.float32) + 1.0) / 256.0)


def _od(images: np.ndarray) -> np.ndarray:
    """The summed optical density of each pixel, float32. A uint8 image looks its channels up
    (the same float32 numbers as the logarithm, in the same order: 0.24 against 1.8 ms a 224
    px crop, which the scale check and the nucleus-size ranking pay per cell)."""
    x = np.asarray(images)
    if x.dtype == np.uint8:
        return (_OD_OF[x[..., 0]] + _OD_OF[x[..., 1]]) + _OD_OF[x[..., 2]]
    x = x.astype(np.float32)
    return -np.log((x + 1.0) / 256.0).sum(axis=-1)


def _stack(images) -> np.ndarray:
    """``images`` as an (N, H, W, 3) array (one (H, W, 3) patch becomes N = 1)."""
    images = np.asarray(images)
    if images.ndim == 3:
        images = images[None]
    if images.ndim != 4 or images.shape[-1] != 3:
        raise ConfigError(f"patches must be (N, H, W, 3), got {images.shape}")
    return images


def nucleus_fraction(images: np.ndarray) -> np.ndarray:
    """(N,) share of each uint8 (N, H, W, 3) patch's pixels that are nucleus (see the module)."""
    images = _stack(images)
    out = np.empty(len(images), dtype=np.float64)
    for i in range(0, len(images), 256):
        od = _od(images[i : i + 256]).reshape(min(256, len(images) - i), -1)
        top = np.percentile(od, 99, axis=1, keepdims=True)
        out[i : i + 256] = (od > NUCLEUS_OD_SHARE * np.maximum(top, 1e-6)).mean(axis=1)
    return out


def zoom_from_nuclei(reference: float, images: np.ndarray) -> float:
    """The factor that gives ``images``' median nucleus area the training median ``reference``
    (areas scale with the square of the factor)."""
    return zoom_from_shares(reference, nucleus_fraction(images))


def zoom_from_shares(reference: float, shares) -> float:
    """:func:`zoom_from_nuclei` from the patches' nucleus shares (:func:`nucleus_fraction`)
    already measured, e.g. chunk by chunk over a folder too large to hold."""
    factor = _factor(reference, float(np.median(shares)) if len(shares) else 0.0)
    if factor is None:
        raise ConfigError("cannot estimate a zoom: no nucleus pixels found in the patches")
    return check_zoom(factor)


def normal_only(items, labels):
    """The cells a folder's scale is judged by (the scale check, ``zoom auto``): those of the
    normal class (label 0) where ``labels`` are known, every one where they are None. An
    abnormal class's enlarged nuclei are not the scale of the folder (hostile round 18: half
    LSIL at the training scale was told "these cells look 1.28x larger")."""
    if labels is None:
        return items
    keep = np.asarray(labels) == 0
    if isinstance(items, np.ndarray):
        return items[keep]
    return [item for item, normal in zip(items, keep, strict=True) if normal]


def field_zoom(
    patch_mpp: float, model_mpp: float, patch_side: int | None, model_side: int | None
) -> float:
    """The zoom that shows patches of ``patch_side`` px at ``patch_mpp`` um/px as the model's
    training patches (``model_side`` px at ``model_mpp``): the ratio of their fields of view, so
    a crop of the model's field at another pixel size gets 1 (it is resized, not zoomed) and a
    wider field its centre. Either side unknown: the ratio of pixel sizes (the sides taken as
    equal)."""
    if patch_side and model_side:
        return patch_side * patch_mpp / (model_side * model_mpp)
    return patch_mpp / model_mpp


def side_words(side: int | None, model_side: int | None, model_mpp: float | None) -> str | None:
    """A crop folder of another side than the model's training crops (``model_side`` px, at
    ``model_mpp`` um/px), given no zoom: each crop is brought to the model's crop as if both
    spanned one field of view, which holds only for crops at another pixel size. Crops of the
    training crops' pixel size in a wider field (``cyto data field`` with another ``--px``)
    had their cells scored smaller and their nuclear areas misread, without a word. One line
    saying so and the flag that cuts each to the model's field, or None within
    :data:`cyto.data.dataset.SIZE_SPREAD`."""
    from cyto.data.dataset import SIZE_SPREAD

    if not side or not model_side or max(side, model_side) <= SIZE_SPREAD * min(side, model_side):
        return None
    ratio = side / model_side
    at = f" ({model_mpp:g} um/px)" if model_mpp else ""
    fix = passing("patch_mpp", model_mpp) if model_mpp else passing("zoom", round(ratio, 3))
    return (
        f"these crops are {side} px a side, the model's training crops {model_side} px: each "
        "is brought to the model's crop as if both spanned one field of view; if they are at "
        f"the training crops' pixel size{at}, their cells are scored {max(ratio, 1 / ratio):.2f}x "
        f"{'smaller' if ratio > 1 else 'larger'} than they are and their areas misread: pass "
        f"{fix} to cut each to the model's field, or cut them as the training crops were "
        f"(cyto data field --px {model_side})"
    )


def _factor(reference: float, median: float) -> float | None:
    if not reference > 0 or not median > 0:
        return None
    return float(np.sqrt(reference / median))


def scale_check(model_nuclei: float | None, images) -> dict | None:
    """How large ``images``' cells look against the model's training normals: the median nucleus
    share of each, the zoom ``factor`` that would match them (> 1: these cells look smaller) and
    whether it is outside :data:`ADVISE_ZOOM` (``advised``). None without a reference or images."""
    if model_nuclei is None or len(images) == 0:
        return None
    return share_check(model_nuclei, nucleus_fraction(images))


def median_bounds(values) -> tuple[float, float]:
    """The order statistics that hold the median of the population ``values`` were drawn from
    with at least :data:`MEDIAN_CONFIDENCE` (distribution-free: how many of n draws lie below
    the median is binomial(n, 1/2), so the k-th smallest and k-th largest hold it with
    1 - 2 P(B < k), exactly). Too few values to hold it so (fewer than 4 at 80 %): (-inf, inf)."""
    from scipy.special import bdtr  # P(B <= k) of binomial(n, p)

    v = np.sort(np.asarray(values, dtype=np.float64))
    n = len(v)
    tail = (1 - MEDIAN_CONFIDENCE) / 2
    if n == 0 or bdtr(0, n, 0.5) > tail:
        return -np.inf, np.inf
    k = int(n // 2)  # the largest k (0-based) with P(B <= k) within the tail: bisected
    lo = 0
    while lo < k:
        mid = (lo + k + 1) // 2
        lo, k = (mid, k) if bdtr(mid, n, 0.5) <= tail else (lo, mid - 1)
    return float(v[k]), float(v[n - 1 - k])


def share_check(model_nuclei: float, shares) -> dict | None:
    """:func:`scale_check` from the cells' nucleus shares (:func:`nucleus_fraction`). Advised
    only when the zoom of every median the sample allows (:func:`median_bounds`) is past
    :data:`ADVISE_ZOOM` on the same side: the median share of a few cells scatters (12
    same-lab Pap crops read "1.47x smaller": hostile round 20; 11 % of 12-crop draws of one
    lab's later crops were told so, 1 % now); never from fewer than 4 cells."""
    if len(shares) == 0:
        return None
    median = float(np.median(shares))
    factor = _factor(model_nuclei, median)
    lo, hi = median_bounds(shares)
    outside = factor is not None and not 1 / ADVISE_ZOOM <= factor <= ADVISE_ZOOM
    # the zooms of the interval's ends (a larger share, a smaller zoom; a share of 0, no
    # nucleus: infinitely small); none where too few cells bound the median, or no factor
    bounded = factor is not None and np.isfinite(lo) and np.isfinite(hi)
    ends = [_factor(model_nuclei, s) if s > 0 else np.inf for s in (lo, hi)] if bounded else []
    # past the bound on the median's side with the check's confidence: another scale said
    sure = (
        outside
        and bool(ends)
        and all(f > ADVISE_ZOOM if factor > 1 else f < 1 / ADVISE_ZOOM for f in ends)
    )
    # every median the sample allows within the bound: the cells look as the model's with the
    # same confidence (what doubts a recorded resolution)
    within = not outside and bool(ends) and all(1 / ADVISE_ZOOM <= f <= ADVISE_ZOOM for f in ends)
    return {
        "cells": len(shares),
        "median_nucleus_share": round(median, 5),
        "model_nucleus_share": model_nuclei,
        "factor": None if factor is None else round(factor, 3),
        "advised": bool(sure),
        # past the bound, but the sample too small to say so
        **({"too_few_cells": True} if outside and not sure else {}),
        "sure_within": bool(within),
    }


def cells_words(n: int) -> str:
    """'1 cell', '12 cells'."""
    return f"{n:,} cell" + ("" if n == 1 else "s")


def look_words(check: dict) -> str:
    """'look 1.69x smaller than the model's training cells (median nucleus share 0.034 of 412
    cells against ...)'."""
    factor = check["factor"]
    how = "smaller" if factor > 1 else "larger"
    times = factor if factor > 1 else 1 / factor
    size = (  # "look 1.00x larger" read as a size
        "look the size of the model's training cells"
        if round(times, 2) == 1
        else f"look {times:.2f}x {how} than the model's training cells"
    )
    return (
        f"{size} (median nucleus share "
        f"{check['median_nucleus_share']:.3f} of {cells_words(check['cells'])} against "
        f"{check['model_nucleus_share']:.3f})"
    )


def scale_advice(model_nuclei: float | None, images) -> str | None:
    """A one-line warning when ``images`` (patches at the model's load size) look more than
    :data:`ADVISE_ZOOM` times smaller or larger than the model's training normals, else None."""
    if len(images) == 0:
        return None
    return share_advice(model_nuclei, nucleus_fraction(images))


#: cells stained otherwise than the model's, said of them ("they ...", "these cells ...")
OTHERWISE = "are stained otherwise than the model's training cells"


def unread_stain(why: str | None) -> str:
    """Cells whose stain could not be read (grayscale crops, stains not separated), said of
    them: a colour-reading nucleus mask misreads them as it does another stain (grey NILM
    crops read 1.37x smaller, and --zoom auto zoomed them: hostile round 63, 1)."""
    return f"have a stain that could not be read ({why or 'no colours to separate'})"


#: why a scale is not judged from the nuclei of cells stained otherwise than the model's
OTHER_STAIN = (
    "the nucleus mask, set on the model's stain, can misread their nuclei's size (other colours "
    "alone, the same cells with their hue turned, read 1.35x smaller)"
)


#: why a Pap folder's nucleus reading is a question, not a zoom to apply: one lab's own NILM
#: crops drift so with acquisition (CRIC's development blocks of 200 by id read 0.92-1.14x of
#: the first: ``benchmarks/results/xeon-icelake-2core/pap/zoom_advice.txt``), and the later
#: crops of the same lab read 1.30x smaller, where --zoom auto, as advised, ranked them at AUROC
#: 0.800 for 0.862 unzoomed (hostile round 68, 3); cells 1.4x larger read within the bound
PAP_DRIFT = (
    "one lab's own Pap cells read up to 1.25x apart between batches of slides, so this may be "
    "the batch, not the scale"
)


def share_advice(
    model_nuclei: float | None,
    shares,
    who: str = "these cells",
    stained_otherwise: str = "",
    stain: str | None = None,
) -> str | None:
    """:func:`scale_advice` from the patches' nucleus shares (:func:`nucleus_fraction`);
    ``who`` names the cells they are of (a labelled folder's normal class:
    :func:`normal_only`). ``stained_otherwise``: why their nuclei's size is not the model's
    mask's to read, said of them (:data:`OTHERWISE`, :func:`unread_stain`): no zoom is
    advised on the nuclei's word; the pixel size is to be checked. ``stain``: the model's; on
    Pap cells the reading drifts within one lab (:data:`PAP_DRIFT`): the pixel size is asked
    for first, and ``--zoom auto`` offered only where it is not known."""
    check = None if model_nuclei is None else share_check(model_nuclei, shares)
    if check is None:
        return None
    if not check["advised"]:
        return _unsure_words(check, who) if not stained_otherwise else None
    if stained_otherwise:
        return (
            f"{who} {look_words(check)}, but they {stained_otherwise}, and {OTHER_STAIN}: "
            f"check their pixel size ({passing('patch_mpp', UM_PER_PX)}) rather than zoom by it"
        )
    if stain == "pap" and check["factor"] > 1:
        return (
            f"{who} {look_words(check)}, but {PAP_DRIFT}: is their pixel size the model's? If "
            f"not, pass {passing('patch_mpp', UM_PER_PX)} (a one-class model can rank another "
            f"scale's normal cells as the most abnormal); {passing('zoom', 'auto')} zooms by "
            "this reading where the pixel size is not known"
        )
    advice = (
        f"{passing('zoom', 'auto')} is advised (or {passing('patch_mpp', UM_PER_PX)})"
        if check["factor"] > 1
        else "a model trained at this scale is advised (a zoom below 1 ranked worse than none)"
        + (lesion_words() if who == "these cells" else "")
    )
    return (
        f"{who} {look_words(check)}; a one-class model can rank another scale's normal "
        f"cells as the most abnormal: {advice}"
    )


#: cells in a folder's scale check below which an unsure reading is not said (its median
#: scatters: hostile round 20), and how far past the bound an unsure reading must be to be said
UNSURE_CELLS = 20
UNSURE_ZOOM = ADVISE_ZOOM**2


def _unsure_words(check: dict, who: str) -> str | None:
    """A reading past the bound that the sample cannot confirm (``too_few_cells``), said as a
    question where the cells look far smaller (past :data:`UNSURE_ZOOM`; larger nuclei are
    what lesions show) on at least :data:`UNSURE_CELLS` cells: 60 NILM crops at half size
    read 1.69x smaller, unconfirmed, and `cyto predict` said nothing while they ranked at
    chance; only --zoom auto's kept-at-1 line said it (hostile round 63, 2)."""
    factor = check.get("factor")
    # smaller only: larger nuclei are what lesions show, and a folder of many was asked so
    far = factor is not None and factor > UNSURE_ZOOM
    if not (check.get("too_few_cells") and far and check["cells"] >= UNSURE_CELLS):
        return None
    return (
        f"{who} {look_words(check)}, too few or too scattered to tell it from "
        f"{1 / ADVISE_ZOOM:.2g}-{ADVISE_ZOOM:g}x (the training scale) with "
        f"{MEDIAN_CONFIDENCE:.0%} confidence: is their pixel size the model's? A one-class model "
        f"can rank another scale's normal cells as the most abnormal; pass "
        f"{passing('patch_mpp', UM_PER_PX)} if known"
    )


def lesion_words() -> str:
    """What else larger cells of an unlabelled folder may be, said wherever they are (the
    scale warning and ``--zoom auto``'s kept-at-1 line: hostile round 22 found it only in the
    first)."""
    return (
        "; enlarged nuclei of abnormal cells look so too: name the normal class "
        f"({passing('normal', 'CLASS')}) and the check reads it alone"
    )


#: said of a zoom below 1 that was given (``--zoom 0.8``, or a ``--patch-mpp`` that makes one),
#: by the command and the Python call alike
SHRINK_WORDS = (
    "a zoom below 1 shrinks the cells and fills the border with plain background, which the "
    "model never saw; measured here it ranked worse than no zoom (bone marrow by a blood model: "
    "AUROC 0.60 against 0.71). Prefer a model trained at this scale"
)


def check_zoom(zoom: float, given: str | None = None, fix: str | None = None) -> float:
    """``zoom`` within :data:`ZOOM_RANGE`, or one line saying what is wrong with it in the
    caller's words: ``given`` says how the caller gave it (``--zoom 0``; None: estimated from
    the nucleus sizes, ``--zoom auto``) and ``fix`` what to do. A zoom the caller gave is named
    as given, never met with advice to give one (hostile round 7: ``predict(zoom=0)`` was told
    to "pass zoom= explicitly")."""
    lo, hi = ZOOM_RANGE
    if lo <= zoom <= hi:
        return zoom
    if given is None:
        given = f"the estimated zoom {zoom:.3g}"
        fix = (
            "these patches are not at a scale a resampling can fix (check their pixel sizes, "
            f"or pass {passing('zoom', FACTOR)} within it)"
        )
    raise ConfigError(f"{given} is outside {lo:g}..{hi:g}: {fix}")


def zoom_patch(img: np.ndarray, zoom: float, size: int | None = None) -> np.ndarray:
    """``img`` (H, W, 3) uint8 magnified ``zoom`` x about its centre, returned at ``size``
    (default: its own). The centre 1/zoom of the image is cut at its native resolution before
    any resize, so enlarging loses no more detail than the crop itself."""
    from cyto.data.images import field_rgb, resize_rgb, square_rgb

    img = square_rgb(img)  # a crop cut at its image's edge keeps its cell's shape
    h, w = img.shape[:2]
    size = size or h
    if zoom == 1.0:
        return img if (h, w) == (size, size) else resize_rgb(img, size)
    side = max(1, round(min(h, w) / zoom))
    # enlarge: the centre square; shrink: the crop amid the background around its cell
    return resize_rgb(field_rgb(img, side), size)


def zoom_patches(images, zoom: float, size: int | None = None) -> np.ndarray:
    """:func:`zoom_patch` over a stack or a list of patches (of any sizes), as one stack."""
    return np.stack([zoom_patch(np.asarray(im), zoom, size) for im in images])


def resolve_zoom(
    zoom: str | float | None,
    patch_mpp: float | None,
    model_mpp: float | None,
    model_nuclei: float | None,
    shares,
    patch_side: int | None = None,
    model_side: int | None = None,
    normal: str | None = None,
    stained_otherwise: str = "",
) -> tuple[float, str]:
    """(factor, how it was found) for ``--zoom FACTOR|auto`` or ``--patch-mpp UM``. ``shares``
    (the nucleus shares of the patches at the model's load size, :func:`nucleus_fraction`, or
    a function that gives them) serve ``auto`` only: those of the normal class ``normal`` where
    the folder is labelled (:func:`normal_only`), else of every patch. ``patch_side`` (the
    patches' side in px) and ``model_side`` (the training patches') serve ``patch_mpp``: the
    zoom is the ratio of the fields of view (:func:`field_zoom`). ``stained_otherwise``: why
    the patches' nuclei are not the model's mask's to size (:data:`OTHERWISE`: their stain is
    not the model's, :mod:`cyto.detect.stain`; :func:`unread_stain`): ``auto`` keeps 1, said."""
    if zoom is not None and patch_mpp is not None:
        raise ConfigError(f"give {said('zoom')} or {said('patch_mpp')}, not both")
    if patch_mpp is not None:
        check_mpp("patch_mpp", patch_mpp)
        if model_mpp is None:
            raise ConfigError(
                f"{said('patch_mpp')}: the model records no training resolution (train it with "
                f"{setting('mpp', UM_PER_PX)}); pass {passing('zoom', FACTOR)} or "
                f"{passing('zoom', 'auto')} instead"
            )
        factor = field_zoom(patch_mpp, model_mpp, patch_side, model_side)
        if patch_side and model_side:
            given = (
                f"{passing('patch_mpp', patch_mpp)} on crops of {patch_side} px against the "
                f"model's {model_side} px at {model_mpp:g} um per pixel, a zoom of {factor:.3g},"
            )
            how = (
                f"the fields of view: {patch_side} px x {patch_mpp:g} um against the model's "
                f"{model_side} px x {model_mpp:g} um"
            )
        else:
            given = (
                f"{passing('patch_mpp', patch_mpp)} over the model's {model_mpp:g} um per pixel, "
                f"a zoom of {factor:.3g},"
            )
            how = (
                f"the pixel sizes: {patch_mpp:g} / {model_mpp:g} um per pixel (the model "
                "records no crop side: taken as these crops')"
            )
        fix = "these patches are not at a scale a resampling can fix (check the pixel sizes)"
        return check_zoom(factor, given, fix), how
    if zoom is None:
        return 1.0, "none"
    if str(zoom).strip().lower() == "auto":
        if model_nuclei is None:
            raise ConfigError(
                f"{passing('zoom', 'auto')}: the model records no nucleus size of its training "
                f"cells (trained by an older cyto); pass {passing('zoom', FACTOR)} or "
                f"{passing('patch_mpp', UM_PER_PX)}"
            )
        of = f" (the normal class, {normal})" if normal else ""
        if stained_otherwise:
            return 1.0, (
                f"auto, kept at 1: these cells{of} {stained_otherwise}, and {OTHER_STAIN}; "
                f"pass {passing('zoom', FACTOR)} or {passing('patch_mpp', UM_PER_PX)} if known"
            )
        shares = shares() if callable(shares) else shares
        check = share_check(model_nuclei, shares)
        if check is not None and check.get("too_few_cells"):  # before the factor's range
            return 1.0, (
                f"auto, kept at 1: these cells{of} {look_words(check)}, too few or too "
                "scattered to tell it from "
                f"{1 / ADVISE_ZOOM:.2g}-{ADVISE_ZOOM:g}x (the training scale) with "
                f"{MEDIAN_CONFIDENCE:.0%} confidence; pass {passing('zoom', FACTOR)} if known"
            )
        factor = zoom_from_shares(model_nuclei, shares)
        if factor > ADVISE_ZOOM:
            return factor, (
                f"the median nucleus size of these patches{of} against the training normals' "
                + ("" if normal else "(assumes most patches show normal cells)")
            ).rstrip()
        # a zoom below 1 shrinks the cells into a border the model never saw: measured, it
        # ranked worse than none (home patches at 0.927x: AUROC 0.842 against 0.885; bone
        # marrow by a blood model: 0.60 against 0.71), so auto never zooms out, nor within
        # the scatter of one lab's own nucleus sizes
        if factor >= 1 / ADVISE_ZOOM:  # how the cells look, never the zoom as a size (round 21)
            return 1.0, (
                f"auto, kept at 1: these cells{of} {look_words(check)}, within "
                f"{1 / ADVISE_ZOOM:.2g}-{ADVISE_ZOOM:g}x, which this check cannot tell from the "
                "training scale (one lab's own cells scatter so, and the nucleus share can read a "
                f"scale error smaller than it is); pass {passing('zoom', FACTOR)} if known"
            )
        return 1.0, (
            f"auto, kept at 1: these cells{of} look {1 / factor:.2f}x larger than the training "
            "cells, and a zoom below 1 ranked worse than none where measured; a model trained "
            "at this scale is advised" + ("" if normal else lesion_words())
        )
    try:
        value = float(zoom)
    except ValueError:
        raise ConfigError(
            f"{said('zoom')} takes a factor (e.g. 1.7) or auto, got {zoom!r}"
        ) from None
    fix = (
        f"give a factor within it (1: the patches as they are; {passing('zoom', 'auto')}: "
        "estimated from their nucleus sizes)"
    )
    return check_zoom(value, passing("zoom", zoom), fix), "given"
