"""Nucleus detection settings and the steps both detectors share.

The numpy form (:mod:`cyto.detect.numpy_form`) and the torch form (:mod:`cyto.detect.torch_form`)
import this module and never each other: the settings (sizes in level-0 pixels at a stated mpp,
presets per kind of slide), the haematoxylin tables, the 2x reduction and its mapping back, and the
last step (one peak per nucleus, the area range) run here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from cyto.errors import ConfigError
from cyto.flags import said


@dataclass(frozen=True)
class NucleusParams:
    """Detection settings in level-0 pixels (defaults: synthetic cells at the 100x-oil scale)."""

    sigma: float = 2.0
    min_distance: int = 24
    min_area: int = 300
    max_area: int = 40_000
    # the threshold's floor: haematoxylin OD below this is never nucleus on a well-stained
    # slide; on a pale one it follows the stain (``floor_share``)
    min_threshold: float = 0.08
    mpp: float = 0.12  # the resolution (um/px) the sizes above are given at
    downsample: int = 0  # detect on a tile reduced this much; 0: 2 when nuclei stay large enough
    kind: str = "smear"  # what the sizes are for (DETECTION_PRESETS); tissue expects crowding
    min_radius: float = 0.0  # a nucleus's inscribed radius at least this (drops thin strands)
    detector: str = "scipy"  # scipy | torch (cyto.detect.torch_form: the same steps in torch)
    #: the haematoxylin threshold for every tile of a slide (:func:`cyto.detect.slide_threshold`);
    #: None: each tile's own Otsu threshold (what one image alone gives), less its opaque pixels
    threshold: float | None = None
    #: the nuclear signal: ``haematoxylin`` (the column of a colour deconvolution: MGG, H&E) or
    #: ``od`` (the optical density summed over R, G, B: Pap, whose light-green cytoplasm a
    #: haematoxylin column counts as nucleus)
    channel: str = "haematoxylin"
    #: Otsu classes: 2 (nucleus or not) or 3 (glass, cytoplasm, nucleus: the upper cut), for a
    #: stain whose cytoplasm is stained too (Pap)
    classes: int = 2
    #: > 0: the signal's background, its grey opening by a disc this wide (px at ``mpp``), is
    #: subtracted first (a white top-hat), so a nucleus is what stands out from its own
    #: surroundings: a pale nucleus in pale cytoplasm and a dark one in dark cytoplasm alike,
    #: whatever the slide's other fields (Pap: one threshold for a whole slide missed the pale
    #: nuclei of its pale fields), while a sheet of cytoplasm wider than the square is removed
    #: whole (a difference of Gaussians left a ring at its edge, taken for nuclei)
    background: float = 0.0
    #: > 0: the floor follows the slide's stain: ``floor_share`` of the signal's 99th percentile
    #: (its darkest nuclei) where that is below ``min_threshold``, never below ``glass_floor``.
    #: The fixed 0.08 lay above a pale MGG smear's own Otsu cut, through the middle of its
    #: nuclei (recall 0.55 on the palest of 12 synthetic slides), while it is what keeps dark
    #: nuclei pressed together apart (their blurred gaps lift the cut's other class) and a
    #: Pap slide's stained cytoplasm out under this preset: a floor that scales with the
    #: nuclei's own darkness keeps both (benchmarks/science/detection/README.md; hostile
    #: round 66, 8). 0: the fixed floor (the Pap and tissue presets)
    floor_share: float = 0.6
    #: the lowest floor ``floor_share`` may set: above the signal of glass and its noise
    glass_floor: float = 0.03

    def __post_init__(self) -> None:
        if self.channel not in CHANNELS:
            raise ConfigError(f"channel must be {' or '.join(CHANNELS)}, got {self.channel!r}")
        if self.background < 0:
            raise ConfigError(f"background must be >= 0, got {self.background}")
        if self.classes not in (2, 3):
            raise ConfigError(f"classes must be 2 or 3, got {self.classes}")
        if self.detector not in DETECTORS:
            raise ConfigError(f"detector must be {' or '.join(DETECTORS)}, got {self.detector!r}")
        if self.kind not in DETECTION_KINDS:
            raise ConfigError(
                f"detection must be one of {', '.join(DETECTION_KINDS)}, got {self.kind!r}"
            )
        if self.min_distance < 1 or self.min_area < 1 or self.max_area <= self.min_area:
            raise ConfigError("need min_distance >= 1 and 1 <= min_area < max_area")
        if self.min_radius < 0:
            raise ConfigError(f"min_radius must be >= 0, got {self.min_radius}")
        if self.mpp <= 0:
            raise ConfigError(f"mpp must be > 0, got {self.mpp}")
        if self.downsample < 0:
            raise ConfigError(f"downsample must be >= 0 (0: automatic), got {self.downsample}")

    def reduction(self) -> int:
        """How much to shrink a tile before detection: 2 when the smallest nucleus still covers
        at least 40 pixels there (4x less work, the same recall on the synthetic slides)."""
        if self.downsample:
            return self.downsample
        return 2 if self.min_area / 4 >= 40 else 1

    def at(self, mpp: float | None) -> NucleusParams:
        """The same physical sizes in the pixels of a slide at ``mpp`` um/px (unchanged when the
        slide's resolution is unknown)."""
        if not mpp or abs(mpp / self.mpp - 1.0) < 0.02:
            return self
        r = self.mpp / mpp
        return NucleusParams(
            sigma=max(0.5, self.sigma * r),
            min_distance=max(1, int(round(self.min_distance * r))),
            min_area=max(1, int(round(self.min_area * r * r))),
            max_area=max(2, int(round(self.max_area * r * r))),
            min_threshold=self.min_threshold,
            mpp=mpp,
            downsample=self.downsample,
            kind=self.kind,
            min_radius=self.min_radius * r,
            detector=self.detector,
            threshold=self.threshold,
            channel=self.channel,
            classes=self.classes,
            background=self.background * r,
            floor_share=self.floor_share,
            glass_floor=self.glass_floor,
        )


DETECTION_KINDS = ("smear", "tissue", "pap")
#: what ``--detection`` / ``detection=`` takes: a kind, or ``auto`` (the model's stain's kind)
DETECTION_CHOICES = ("auto", *DETECTION_KINDS)
CHANNELS = ("haematoxylin", "od")
#: the detection a bundle's stain gets by default (``--detection auto``)
DETECTION_OF_STAIN = {"mgg": "smear", "pap": "pap", "he": "tissue"}
DETECTORS = ("scipy", "torch")


def detection_preset(kind: str) -> NucleusParams:
    """Detection settings for a kind of slide.

    ``smear`` (the default): cytology smears at the 100x-oil scale, cells apart, small nuclei
    still found (lymphocytes, fragments). ``tissue``: sections (H&E and the like), nuclei packed
    a few microns apart: more smoothing (1 um) so chromatin texture does not split a nucleus,
    peaks at least 5 um apart, nuclei of 12 to 400 um^2 with an inscribed radius of at least
    1.5 um (thin keratin strands and fibres fail it) and a higher haematoxylin floor.

    Measured on the CMU-1 H&E region (0.499 um/px, 2220 x 2967 px; no nucleus ground truth there,
    so judged on overlays): the smear settings mark 1,504 points a median 6.1 um apart (less than
    a nucleus) and miss the packed basal nuclei of the epidermis; these mark 1,327 points 9.2 um
    apart and find them. Still marked wrongly: flakes of keratin, and pale nuclei of the upper
    epidermis are missed. For sections, nucleus points from a dedicated detector (``--nuclei``)
    are better. A crop at a cytology model's scale holds many nuclei in a section; with
    ``tissue`` that is expected and not warned.
    """
    if kind not in DETECTION_KINDS:
        raise ConfigError(
            f"{said('detection')} must be one of {', '.join(DETECTION_KINDS)}, got {kind!r}"
        )
    if kind == "smear":
        return NucleusParams()
    if kind == "pap":
        # sizes at 0.12 um/px, like the defaults: 1 um = 8.33 px, 1 um^2 = 69.4 px. A squamous
        # nucleus: 15 (pyknotic superficial) to about 300 um^2 (a large low-grade lesion's).
        # Chosen on CRIC's development crops and generated Pap tiles
        # (benchmarks/science/pap/README.md): the background of a 20 um opening taken off,
        # two classes; three classes of the plain density found fewer crops' centre nuclei
        # (a NILM crop's annotated point is often off its nucleus: see there). A 16 um opening
        # took off the large pale nuclei of low-grade lesions whole (2 of the 4 the eye audit
        # saw missed, of 47 crops centred on a nucleus, are found at 20 um); at 22 um and more
        # dense cytoplasm of the smallest squamous cells (parabasal, 20-30 um) stands out
        return NucleusParams(
            sigma=5.0,  # 0.6 um, as the Pap cell mask (cyto.detect.morphometry)
            min_distance=33,  # 4 um: the two nuclei of a binucleated cell stay two
            min_area=555,  # 8 um^2
            max_area=27_800,  # 400 um^2
            min_threshold=0.01,  # above the background: glass and noise stay out
            kind="pap",
            min_radius=10.0,  # 1.2 um: bacteria and strands of mucus are thinner
            channel="od",
            classes=2,
            background=167.0,  # 20 um: a large low-grade nucleus (300 um^2: 19.5 um across)
            floor_share=0.0,
        )
    # sizes at 0.12 um/px, like the defaults: 1 um = 8.33 px, 1 um^2 = 69.4 px
    return NucleusParams(
        sigma=8.0,
        min_distance=42,
        min_area=833,
        max_area=27_800,
        min_threshold=0.1,
        kind="tissue",
        min_radius=12.5,  # 1.5 um
        floor_share=0.0,
    )


_HED_LOG = np.log(np.maximum(np.arange(256) / 255.0, 1e-6)) / np.log(1e-6)
# the haematoxylin column of skimage's hed_from_rgb (Ruifrok & Johnston)
_H_FROM_RGB = (1.87798274, -0.06590806, -0.60190736)


def reduced_params(params: NucleusParams, k: int) -> NucleusParams:
    """The settings for a tile reduced ``k`` times (the same physical sizes)."""
    return replace(params.at(params.mpp * k), downsample=1)


def from_reduced(found: np.ndarray, k: int) -> np.ndarray:
    """Detections on a tile reduced ``k`` times, in the tile's pixels (the centre of each k x k
    block; areas times k^2)."""
    found[:, :2] = found[:, :2] * k + (k - 1) / 2.0
    found[:, 2] *= k * k
    return found


def otsu_cut(values: np.ndarray, classes: int) -> float:
    """The nucleus cut of ``values``: Otsu's threshold (two classes), or the upper of the
    three-class one (glass, cytoplasm, nucleus). A constant image raises ValueError."""
    if float(values.min()) == float(values.max()):
        raise ValueError("a constant image has no Otsu threshold")
    if classes == 3:
        from skimage.filters import threshold_multiotsu

        return float(threshold_multiotsu(values, classes=3)[-1])
    from skimage.filters import threshold_otsu

    return float(threshold_otsu(values))


def subtract_background(signal: np.ndarray, side: float) -> np.ndarray:
    """``signal`` (float32, H x W) less its background: its grey opening by a disc ``side`` px
    across (a white top-hat: what is narrower than the disc stands out, a wider sheet is
    removed whole), the opening taken on the signal reduced 4x and enlarged back (a disc of 63
    px over a 1,100 px tile: 490 ms in full, 5 ms reduced). Both detectors take it here, on the
    host."""
    import cv2

    signal = np.ascontiguousarray(signal, dtype=np.float32)
    h, w = signal.shape
    k = 4 if min(h, w) >= 64 and side >= 16 else 1
    small = cv2.resize(signal, (max(1, w // k), max(1, h // k)), interpolation=cv2.INTER_AREA)
    d = max(3, int(round(side / k)) | 1)
    disc = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (d, d))
    opened = cv2.morphologyEx(small, cv2.MORPH_OPEN, disc, borderType=cv2.BORDER_REFLECT)
    if k > 1:
        opened = cv2.resize(opened, (w, h), interpolation=cv2.INTER_LINEAR)
    return signal - np.minimum(opened, signal)


def nuclei_from_peaks(
    peaks: np.ndarray, dist: np.ndarray, labels: np.ndarray, areas: np.ndarray, params
) -> np.ndarray:
    """(N, 3) x, y, area from distance-transform peaks (row, col): one peak per nucleus, deep
    enough (``min_radius``), whose area is in range. Both detectors end here.

    A nucleus's area is its component's, or, where touching nuclei form one component (a
    dense band, a clump), the component's area shared among its peaks in proportion to their
    inscribed discs (depth squared). A band of packed nuclei used to be one component far above
    ``max_area``, and every nucleus in it was dropped (0 cells); a single dark blob still has
    one deep peak holding nearly all its area, and is still dropped."""
    peaks = _one_peak_per_nucleus(peaks, dist, labels)
    if params.min_radius > 0:
        peaks = peaks[dist[peaks[:, 0], peaks[:, 1]] >= params.min_radius]
    if len(peaks) == 0:
        return np.empty((0, 3), dtype=np.float64)
    comp = labels[peaks[:, 0], peaks[:, 1]]
    # squared distances of an exact distance transform are whole numbers: rounded, both
    # detectors (float64 SciPy, float32 torch) share out the same areas
    depth2 = np.rint(dist[peaks[:, 0], peaks[:, 1]].astype(np.float64) ** 2)
    share = depth2 / np.bincount(comp, weights=depth2)[comp]
    area = areas[comp - 1] * share
    keep = (area >= params.min_area) & (area <= params.max_area)
    return np.column_stack(
        [peaks[keep, 1].astype(np.float64), peaks[keep, 0].astype(np.float64), area[keep]]
    )


def _one_peak_per_nucleus(peaks: np.ndarray, dist: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Drop secondary peaks of one nucleus, keep one peak per touching nucleus.

    A large or irregular nucleus has a ridge in its distance transform, and peak detection can
    find two maxima on it. Peaks are visited from the deepest; a peak is dropped when it lies in
    the same component as a kept one, closer than 1.5x the kept peak's depth (its inscribed
    radius r): two touching round nuclei have their centres about 2r apart and both stay.

    Compared in whole numbers (squared pixel gaps against squared depths, which an exact
    distance transform makes whole), so a gap of exactly 1.5 r is settled the same way by both
    detectors, whatever the rounding of their float64 or float32 depths.
    """
    if len(peaks) < 2:
        return peaks
    depth2 = np.rint(dist[peaks[:, 0], peaks[:, 1]].astype(np.float64) ** 2).astype(np.int64)
    comp = labels[peaks[:, 0], peaks[:, 1]]
    order = np.argsort(-depth2, kind="stable")
    rank = np.empty(len(order), dtype=np.intp)
    rank[order] = np.arange(len(order))
    # pairs that can clash: same component, closer than 1.5x the deeper one's depth
    from scipy.spatial import cKDTree

    from cyto.detect.peaks import kept_in_order

    reach = 1.5 * np.sqrt(float(depth2.max())) + 1.0
    pairs = cKDTree(peaks).query_pairs(reach, output_type="ndarray")
    pairs = pairs[comp[pairs[:, 0]] == comp[pairs[:, 1]]]
    first = np.where(rank[pairs[:, 0]] < rank[pairs[:, 1]], pairs[:, 0], pairs[:, 1])
    then = pairs[:, 0] + pairs[:, 1] - first
    gap2 = ((peaks[then] - peaks[first]).astype(np.int64) ** 2).sum(axis=1)
    clash = 4 * gap2 < 9 * depth2[first]  # gap < 1.5 depth
    # visited deepest first: a kept peak drops those it clashes with
    keep = kept_in_order(len(peaks), first[clash], then[clash], rank)
    return peaks[keep]


def in_core(points: np.ndarray, x0: int, y0: int, w: int, h: int) -> np.ndarray:
    """The rows of ``points`` (x, y first) whose centre lies in ``[x0, x0+w) x [y0, y0+h)``."""
    keep = (
        (points[:, 0] >= x0)
        & (points[:, 0] < x0 + w)
        & (points[:, 1] >= y0)
        & (points[:, 1] < y0 + h)
    )
    return points[keep]


#: a pixel darker than this in every channel passed no light: the black fill of a crop tool or
#: a scanner, opaque ink or debris. Its optical density (5.5 a channel at black) stretched Otsu's
#: histogram: six black-barred crops of 177 on a slide raised its threshold 16x and lost 93 % of
#: the cells. No pixel of CRIC's 2,827 Pap crops is this dark (16: 1,294 pixels of 49 crops,
#: hyperchromatic nuclei, which must stay); a pen mark that lets some light through is not it
OPAQUE_RGB = 8


def check_tile(rgb) -> None:
    """Refuse, in one line, what the detectors cannot read as an RGB tile: another shape, dtype
    or an empty image (a numpy array or a torch tensor; only shape and dtype are looked at).
    Round 20: a grey 2-D, uint16, float or empty image raised one of four library errors, and
    the torch detector found no nuclei at all in a 0-1 float image."""
    shape = tuple(int(n) for n in rgb.shape)
    dtype = str(rgb.dtype).removeprefix("torch.")
    what = f"got a {' x '.join(map(str, shape)) or 'scalar'} {dtype} image"
    if len(shape) != 3 or shape[2] not in (3, 4):
        grey = " (a grey image: np.dstack([g, g, g]))" if len(shape) == 2 else ""
        raise ConfigError(f"detect_nuclei takes an H x W x 3 RGB image; {what}{grey}")
    if dtype != "uint8":
        raise ConfigError(
            f"detect_nuclei takes 8-bit RGB (uint8, 0-255); {what}: scale it to 0-255 and "
            "convert (a 16-bit image: img >> 8; a 0-1 float image: np.round(img * 255))"
        )
    if shape[0] == 0 or shape[1] == 0:
        raise ConfigError(f"detect_nuclei takes an image with pixels; {what}")


def is_opaque(rgb: np.ndarray) -> np.ndarray:
    """Whether each pixel of ``rgb`` (..., 3 or 4: an alpha channel is not a colour) passed no
    light: darker than :data:`OPAQUE_RGB` in every colour channel. (The channels' maximum pair
    by pair: a reduction over the last axis of three is 20x slower.)"""
    return np.maximum(np.maximum(rgb[..., 0], rgb[..., 1]), rgb[..., 2]) < OPAQUE_RGB


def off_ink(found: np.ndarray, colours: np.ndarray) -> np.ndarray:
    """The rows of ``found`` (x, y, area) whose centre pixel, of colour ``colours`` (one row
    each), let light through: a blot of ink or black fill is no nucleus (3 % ink on a Pap tile
    gave 30 "nuclei" beside its 25). No nucleus of the data measured is that dark
    (:data:`OPAQUE_RGB`). Both detectors end here, on the few found."""
    if not len(found):
        return found
    return found[~is_opaque(colours)]


def opaque_reach(rgb: np.ndarray, sigma: float) -> np.ndarray | None:
    """The opaque pixels of ``rgb`` (:data:`OPAQUE_RGB`) and what smoothing at ``sigma``
    carries from them (H x W bool); None when it has none. A threshold is measured without
    them (:func:`clear_of_opaque`): the one rule of the slide's threshold and of a tile's own."""
    from scipy import ndimage

    opaque = is_opaque(rgb)
    if not opaque.any():
        return None
    reach = max(1, int(np.ceil(3 * sigma)))  # the smoothing carries them this far
    return ndimage.binary_dilation(opaque, iterations=reach)


def own_threshold(values: np.ndarray, params: NucleusParams) -> float:
    """The threshold ``values`` give (the signal less its opaque pixels, :func:`clear_of_opaque`):
    Otsu's cut in ``params.classes``, with the floor. ValueError when they give none: no values
    (nothing but ink) or a constant tile. Both detectors' own threshold, and the slide's."""
    if values.size == 0:
        raise ValueError("nothing but opaque pixels")
    return max(otsu_cut(values, params.classes), floor_of(values, params))


def lowest_floor(params: NucleusParams) -> float:
    """The lowest threshold ``params`` can give (:func:`floor_of`): a signal below it anywhere
    is no nucleus, and a slide's threshold is never taken below it."""
    return params.glass_floor if params.floor_share > 0 else params.min_threshold


def floor_of(values, params: NucleusParams) -> float:
    """The threshold's floor for a signal ``values`` (numpy, or a torch tensor, read on the
    host): ``min_threshold``, lowered on a pale slide to ``floor_share`` of the signal's 99th
    percentile, not below ``glass_floor`` (:attr:`NucleusParams.floor_share`)."""
    if params.floor_share <= 0:
        return params.min_threshold
    if not isinstance(values, np.ndarray):
        values = values.detach().cpu().numpy()
    dark = float(np.percentile(values, 99)) if values.size else 0.0
    return max(params.glass_floor, min(params.min_threshold, params.floor_share * dark))


def clear_of_opaque(smooth: np.ndarray, reach: np.ndarray | None) -> np.ndarray:
    """The values of ``smooth`` that a threshold is measured on, flat: all but ``reach``
    (:func:`opaque_reach`)."""
    return smooth.ravel() if reach is None else smooth[~reach]
