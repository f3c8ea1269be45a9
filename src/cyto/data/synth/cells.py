"""Procedural stained cells: the optical model shared by synthetic patches and synthetic slides.

Cells are drawn in optical-density (OD) space, the way light is absorbed by a stained smear
(Beer-Lambert): every object adds ``concentration x stain-vector`` to a per-pixel OD map, and the
image is ``I0 * exp(-OD)``. Because OD adds up, overlapping objects darken each other like real
overlapping cells, and a scene can be drawn in any order, or tile by tile, with the same result.

The look follows May-Gruenwald-Giemsa bone-marrow smears (the paper's bone-marrow data): purple
nuclei, pale-blue basophilic cytoplasm, pink red cells. Each cell is drawn from its own seed into
its own window, so its pixels do not depend on which tile or patch it is drawn into.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import ndimage
from scipy.special import expit

# Absorbance of one unit of each stain in R, G, B.
STAIN_NUCLEUS = np.array([0.62, 0.86, 0.30], dtype=np.float32)  # azure/eosin: purple chromatin
STAIN_CYTO = np.array([0.46, 0.24, 0.07], dtype=np.float32)  # methylene blue: basophilic cytoplasm
STAIN_RBC = np.array([0.12, 0.46, 0.30], dtype=np.float32)  # eosin: red cells
STAIN_GRANULE = np.array([0.30, 0.62, 0.55], dtype=np.float32)  # debris / platelets

NORMAL_CLASS = "normal"
ABNORMAL_CLASSES = (
    "enlarged",  # blast-like: large nucleus and cell, high N:C, fine open chromatin
    "irregular",  # lobed / cleaved nuclear contour
    "nucleolar",  # prominent nucleoli in an open chromatin
    "coarse",  # coarse, clumped chromatin with clear parachromatin
    "multinucleated",  # two or three nuclei in one cell
    "hyperchromatic",  # a darker nucleus of normal size
)
CELL_CLASSES = (NORMAL_CLASS, *ABNORMAL_CLASSES)

# Length scale of the default look: a lymphocyte nucleus of about 28 px radius, i.e. 0.12 um/px, the
# sampling of a 100x oil-immersion field (how bone-marrow smears are read).
DEFAULT_SCALE = 1.5
MPP_AT_SCALE_1 = 0.18


@dataclass(frozen=True)
class CellSpec:
    """Geometry and appearance of one cell; every field is drawn by :func:`sample_cell`."""

    cls: str
    cell_radius: float
    nuclei: tuple[tuple[float, float, float], ...]  # (dx, dy, radius) relative to the cell centre
    contour: tuple[tuple[float, float], ...]  # Fourier (amplitude, phase) for harmonics 2..
    nucleus_density: float
    cyto_density: float
    chromatin_scale: float  # spatial scale (px) of chromatin clumps
    chromatin_contrast: float
    nucleoli: int
    blur: float  # Gaussian sigma (px) at the in-focus plane
    focus_z: float  # focal plane (um) where the cell is sharpest
    seed: int


def _nucleus_shape(rng: np.random.Generator, irregular: bool) -> tuple[tuple[float, float], ...]:
    harmonics = []
    for k in range(2, 8):
        if irregular:
            amp = rng.uniform(0.06, 0.16) / (1 + 0.25 * (k - 2))
        else:
            amp = rng.uniform(0.0, 0.045) / (1 + 0.6 * (k - 2))
        harmonics.append((float(amp), float(rng.uniform(0, 2 * np.pi))))
    return tuple(harmonics)


def sample_cell(cls: str, rng: np.random.Generator, scale: float = DEFAULT_SCALE) -> CellSpec:
    """Draw the parameters of one cell of class ``cls``.

    ``scale`` multiplies every length (1.0: a lymphocyte nucleus radius of about 19 px, i.e.
    0.18 um/px). Class shifts overlap the normal class's spread on
    purpose: colour alone must not separate the classes, morphology must.
    """
    if cls not in CELL_CLASSES:
        raise ValueError(f"unknown cell class {cls!r}; known: {', '.join(CELL_CLASSES)}")
    # Normal lymphocyte: small, round, dense nucleus, thin cytoplasm rim.
    r_nuc = rng.normal(19.0, 1.6)
    rim = rng.uniform(3.0, 6.5)
    density = rng.uniform(1.15, 1.55)
    chrom_scale = rng.uniform(1.6, 2.4)
    chrom_contrast = rng.uniform(0.18, 0.30)
    nucleoli = 0
    irregular = False
    offset = rng.normal(0, 1.0, size=2)
    n_nuclei = 1
    cyto = rng.uniform(0.45, 0.8)

    if cls == "enlarged":
        r_nuc = rng.normal(30.0, 3.0)
        rim = rng.uniform(4.0, 10.0)
        density = rng.uniform(0.95, 1.3)  # open chromatin: lighter per pixel, larger area
        chrom_scale = rng.uniform(1.0, 1.5)
        chrom_contrast = rng.uniform(0.08, 0.16)
        nucleoli = int(rng.integers(0, 2))
    elif cls == "irregular":
        r_nuc = rng.normal(21.0, 2.0)
        irregular = True
    elif cls == "nucleolar":
        r_nuc = rng.normal(23.0, 2.0)
        density = rng.uniform(1.0, 1.4)
        chrom_contrast = rng.uniform(0.10, 0.18)
        nucleoli = int(rng.integers(2, 5))
    elif cls == "coarse":
        r_nuc = rng.normal(21.0, 1.8)
        chrom_scale = rng.uniform(3.2, 4.5)
        chrom_contrast = rng.uniform(0.55, 0.75)
    elif cls == "multinucleated":
        n_nuclei = int(rng.integers(2, 4))
        r_nuc = rng.normal(15.5, 1.5)
        rim = rng.uniform(6.0, 10.0)
    elif cls == "hyperchromatic":
        r_nuc = rng.normal(20.5, 1.8)
        density = rng.uniform(1.6, 2.1)
        chrom_contrast = rng.uniform(0.10, 0.2)

    r_nuc = max(r_nuc, 9.0)
    nuclei: list[tuple[float, float, float]] = []
    if n_nuclei == 1:
        nuclei.append((float(offset[0]), float(offset[1]), float(r_nuc)))
        cell_r = r_nuc + rim + float(np.hypot(*offset))
    else:
        angle0 = rng.uniform(0, 2 * np.pi)
        spread = r_nuc * rng.uniform(0.85, 1.05)
        for i in range(n_nuclei):
            a = angle0 + 2 * np.pi * i / n_nuclei + rng.normal(0, 0.2)
            rr = r_nuc * rng.uniform(0.85, 1.1)
            nuclei.append((float(spread * np.cos(a)), float(spread * np.sin(a)), float(rr)))
        cell_r = spread + r_nuc * 1.1 + rim
    return CellSpec(
        cls=cls,
        cell_radius=float(cell_r * scale),
        nuclei=tuple((dx * scale, dy * scale, r * scale) for dx, dy, r in nuclei),
        contour=_nucleus_shape(rng, irregular),
        nucleus_density=float(density),
        cyto_density=float(cyto),
        chromatin_scale=float(chrom_scale * scale),
        chromatin_contrast=float(chrom_contrast),
        nucleoli=nucleoli,
        blur=float(rng.uniform(0.4, 1.1) * scale),
        focus_z=float(rng.normal(0.0, 0.6)),
        seed=int(rng.integers(0, 2**31 - 1)),
    )


def _smooth_noise(rng: np.random.Generator, shape: tuple[int, int], sigma: float) -> np.ndarray:
    noise = ndimage.gaussian_filter(rng.standard_normal(shape).astype(np.float32), sigma)
    std = float(noise.std())
    return noise / std if std > 0 else noise


def render_cell_od(
    spec: CellSpec, defocus: float = 0.0, nucleus_gain: float = 1.0, cyto_gain: float = 1.0
) -> tuple[np.ndarray, int]:
    """Draw one cell into its own OD window.

    Args:
        spec: the cell.
        defocus: distance (um) between the rendered focal plane and the cell's sharpest plane;
            it widens the blur.
        nucleus_gain: stain intensity of the nuclear stain (a property of the slide, not the cell).
        cyto_gain: stain intensity of the cytoplasmic stain.

    Returns:
        ``(od, half)``: an ``(2*half+1, 2*half+1, 3)`` float32 OD window centred on the cell.
    """
    rng = np.random.default_rng(spec.seed)
    blur = float(np.hypot(spec.blur, 2.2 * abs(defocus)))
    half = int(np.ceil(spec.cell_radius + 3 * blur + 3))
    size = 2 * half + 1
    yy, xx = np.mgrid[-half : half + 1, -half : half + 1].astype(np.float32)

    # Cytoplasm: a slightly elliptic disc with a soft edge and a faint perinuclear clear zone.
    ell = rng.uniform(0.9, 1.1)
    rho_c = np.hypot(xx * ell, yy / ell)
    cyto_mask = expit((rho_c - spec.cell_radius) / -0.9)
    cyto_tex = 1.0 + 0.12 * _smooth_noise(rng, (size, size), 3.0)
    conc_cyto = spec.cyto_density * cyto_mask * cyto_tex

    nuc_mask = np.zeros((size, size), dtype=np.float32)
    for dx, dy, r in spec.nuclei:
        theta = np.arctan2(yy - dy, xx - dx)
        rad = np.full_like(theta, r)
        for k, (amp, phase) in enumerate(spec.contour, start=2):
            rad += r * amp * np.cos(k * theta + phase)
        rho = np.hypot(xx - dx, yy - dy)
        nuc_mask = np.maximum(nuc_mask, expit((rho - rad) / -0.8))

    fine = _smooth_noise(rng, (size, size), max(spec.chromatin_scale * 0.5, 0.6))
    clumps = _smooth_noise(rng, (size, size), spec.chromatin_scale)
    chromatin = 1.0 + spec.chromatin_contrast * (0.45 * fine + np.tanh(1.5 * clumps))
    conc_nuc = spec.nucleus_density * nuc_mask * np.clip(chromatin, 0.15, None)

    if spec.nucleoli:
        dx, dy, r = spec.nuclei[0]
        for _ in range(spec.nucleoli):
            a, d = rng.uniform(0, 2 * np.pi), rng.uniform(0.1, 0.55) * r
            nr = rng.uniform(0.13, 0.2) * r
            rho = np.hypot(xx - dx - d * np.cos(a), yy - dy - d * np.sin(a))
            spot = expit((rho - nr) / -0.7)
            ring = np.exp(-(((rho - nr) / 1.1) ** 2))
            # a nucleolus is paler than the chromatin around it, with a darker rim
            conc_nuc = conc_nuc * (1 - 0.55 * spot) + 0.25 * ring * nuc_mask
    # the nucleus displaces cytoplasm
    conc_cyto = conc_cyto * (1 - nuc_mask)

    od = (nucleus_gain * conc_nuc)[..., None] * STAIN_NUCLEUS
    od += (cyto_gain * conc_cyto)[..., None] * STAIN_CYTO
    if blur > 0.05:
        od = ndimage.gaussian_filter(od, sigma=(blur, blur, 0))
    return od.astype(np.float32), half


def render_rbc_od(
    radius: float, seed: int, blur: float, gain: float = 1.0
) -> tuple[np.ndarray, int]:
    """A red blood cell: a pink disc with a paler centre (biconcave)."""
    rng = np.random.default_rng(seed)
    half = int(np.ceil(radius + 3 * blur + 3))
    yy, xx = np.mgrid[-half : half + 1, -half : half + 1].astype(np.float32)
    ell = rng.uniform(0.85, 1.15)
    rho = np.hypot(xx * ell, yy / ell)
    disc = expit((rho - radius) / -0.8)
    pallor = 1.0 - 0.45 * np.exp(-((rho / (0.45 * radius)) ** 2))
    conc = gain * rng.uniform(0.7, 1.1) * disc * pallor
    od = conc[..., None] * STAIN_RBC
    if blur > 0.05:
        od = ndimage.gaussian_filter(od, sigma=(blur, blur, 0))
    return od.astype(np.float32), half


def render_debris_od(radius: float, seed: int) -> tuple[np.ndarray, int]:
    """Platelets, granules and smudge: small irregular blobs."""
    rng = np.random.default_rng(seed)
    half = int(np.ceil(radius * 1.5 + 4))
    size = 2 * half + 1
    blob = _smooth_noise(rng, (size, size), max(radius / 3, 1.0))
    yy, xx = np.mgrid[-half : half + 1, -half : half + 1].astype(np.float32)
    env = np.exp(-((np.hypot(xx, yy) / max(radius, 1.0)) ** 2))
    conc = np.clip(blob, 0, None) * env * rng.uniform(0.4, 1.0)
    od = conc[..., None] * STAIN_GRANULE
    return ndimage.gaussian_filter(od, sigma=(0.7, 0.7, 0)).astype(np.float32), half


def add_window(canvas: np.ndarray, window: np.ndarray, cx: float, cy: float, half: int) -> None:
    """Add an OD window centred at canvas pixel ``(cx, cy)``, clipped to the canvas, in place."""
    h, w = canvas.shape[:2]
    x0, y0 = int(round(cx)) - half, int(round(cy)) - half
    x1, y1 = x0 + window.shape[1], y0 + window.shape[0]
    cx0, cy0, cx1, cy1 = max(x0, 0), max(y0, 0), min(x1, w), min(y1, h)
    if cx0 >= cx1 or cy0 >= cy1:
        return
    canvas[cy0:cy1, cx0:cx1] += window[cy0 - y0 : cy1 - y0, cx0 - x0 : cx1 - x0]


@dataclass(frozen=True)
class StainStyle:
    """Per-slide or per-patch staining and illumination (the batch effect of a real lab)."""

    nucleus_gain: float
    cyto_gain: float
    rbc_gain: float
    tint: tuple[float, float, float]  # background OD of the glass and mounting medium
    brightness: float
    noise: float

    @staticmethod
    def sample(rng: np.random.Generator) -> StainStyle:
        return StainStyle(
            nucleus_gain=float(rng.uniform(0.75, 1.6)),
            cyto_gain=float(rng.uniform(0.7, 1.3)),
            rbc_gain=float(rng.uniform(0.7, 1.3)),
            tint=tuple(float(v) for v in rng.uniform(0.0, 0.12, size=3)),
            brightness=float(rng.uniform(0.86, 1.0)),
            noise=float(rng.uniform(1.5, 4.0)),
        )


def od_to_rgb(
    od: np.ndarray, style: StainStyle, rng: np.random.Generator, illumination: np.ndarray | None
) -> np.ndarray:
    """Turn an OD canvas into a uint8 RGB image with tint, illumination and sensor noise."""
    od = od + np.asarray(style.tint, dtype=np.float32)
    img = 250.0 * style.brightness * np.exp(-od)
    if illumination is not None:
        img *= illumination[..., None]
    img += rng.normal(0.0, style.noise, size=img.shape).astype(np.float32)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)
