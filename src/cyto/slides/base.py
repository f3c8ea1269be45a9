"""What every slide reader shares: the slide's description, the reader protocol, RGB conversion
and white padding outside the slide."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from cyto.errors import UnsupportedSlideError

PAD = 255
PLANE_SEP = "#page="  # FILE.ndpi#page=N: an NDPI z-offset page read as a focal plane


@dataclass(frozen=True)
class SlideInfo:
    path: Path
    backend: str
    vendor: str
    width: int
    height: int
    level_dims: tuple[tuple[int, int], ...]
    level_downsamples: tuple[float, ...]
    mpp: float | None
    objective: float | None
    properties: dict[str, str] = field(default_factory=dict, repr=False)


class SlideReader(Protocol):
    info: SlideInfo

    def read_region(self, x: int, y: int, w: int, h: int, level: int = 0) -> np.ndarray: ...

    def close(self) -> None: ...


def listed_slide_name(name: str) -> bool:
    """Whether a name in a listed folder (or under a prefix) may be a slide: not a hidden one
    (``.x.tif``, macOS's ``._x.tif`` resource forks), which a folder's listing passes over as
    ``ls`` does (a ``._`` file was a failed slide at each look of a watch: hostile round 76,
    7). Named on its own, a hidden file is read as given."""
    return not name.startswith(".")


def sampled_ranges(size: int, block: int = 1 << 16, samples: int = 32) -> list[tuple[int, int]]:
    """The (start, length) byte ranges whose bytes identify an object of ``size`` bytes, fast
    on 10 GB slides: its first and last MiB and ``samples`` blocks spread evenly between them
    (about 3 MiB). One rule for a local slide file (:func:`cyto.infer.store.slide_identity`)
    and a remote object whose server states no version of it
    (:meth:`cyto.slides.remote.RemoteObject.identity`); a range past the end reads nothing."""
    edge = 1 << 20
    middle = [(edge + (max(size - 2 * edge, 0) * i) // samples, block) for i in range(samples)]
    return [(0, edge), *middle, (max(size - edge, 0), edge)]


def printable(text: object) -> str:
    """``text`` (a path, a name) as valid UTF-8 for a message, a CSV cell, a Parquet column or
    a JSON string: the bytes of a file name that is not UTF-8 (``b"slide-\\xff.tif"``, which
    Python holds as surrogate escapes) written as ``\\xff``; any other text is unchanged."""
    s = str(text)
    try:
        raw = s.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate no file name decodes to
        return s.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


def _float(value: object) -> float | None:
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return v if v > 0 else None


#: libvips' sample formats cyto reads (an 8-bit slide as it is, a 16-bit one scaled to 8 bits)
READABLE_FORMATS = ("uchar", "ushort")
_FORMAT_WORDS = {
    "char": "signed 8-bit integers",
    "short": "signed 16-bit integers",
    "uint": "32-bit integers",
    "int": "signed 32-bit integers",
    "float": "32-bit floating point",
    "double": "64-bit floating point",
    "complex": "complex numbers",
    "dpcomplex": "complex numbers",
}
_CONVERT = "convert it to 8-bit RGB (e.g. vips colourspace IN OUT.tif[tile,pyramid] srgb)"


def check_pixels(path: object, bands: int, sample_format: str, interpretation: str) -> None:
    """Refuse, in one line naming the format, an image whose pixels cyto cannot turn into
    RGB without guessing what they mean: another colour space (CIE L*a*b*), floating-point,
    signed or 32-bit samples (their white is not known), CMYK (its colours need the printer's
    profile) and more than four samples per pixel (a multispectral or unknown layout).
    Everything else is converted on reading by :func:`_to_rgb`."""
    if interpretation in ("lab", "labs", "lch", "xyz", "yxy", "cmc", "hsv"):
        raise UnsupportedSlideError(
            f"{path}: its pixels are in the {interpretation.upper()} colour space, not RGB: "
            f"{_CONVERT}"
        )
    if sample_format not in READABLE_FORMATS:
        what = _FORMAT_WORDS.get(sample_format, sample_format)
        raise UnsupportedSlideError(
            f"{path}: its samples are {what}; cyto reads 8- and 16-bit unsigned images: {_CONVERT}"
        )
    if interpretation == "cmyk":
        raise UnsupportedSlideError(
            f"{path}: a CMYK (separated) TIFF; its colours cannot be turned into the scanner's "
            f"RGB without the printer's colour profile: {_CONVERT}"
        )
    if not 1 <= bands <= 4:
        raise UnsupportedSlideError(
            f"{path}: {bands} samples per pixel; cyto reads grayscale, grayscale + alpha, RGB "
            f"and RGBA images: {_CONVERT}"
        )


#: the property a reader of 16-bit samples records where their white is below 65535 (its value)
BITS_KEY = "cyto.sixteen-bit-white"


def sixteen_bit_top(level) -> int:
    """The white of a slide of 16-bit samples: the top of the bits its values take
    (:func:`cyto.data.images.bit_depth`: a scanner's 12-bit values stored as 16 bits are read
    to 4095, as a camera's crops are; they were read 16x dark, hostile round 51, 3), read from
    ``level`` (a libvips image: the slide's smallest level, whose glass holds its brightest
    values; of one that large, an 8 x 8 grid of windows of it)."""
    from cyto.data.images import bit_depth

    if level.bands in (2, 4):  # alpha, at its full 65535 where opaque, tells no depth
        level = level.extract_band(0, n=level.bands - 1)
    if level.width * level.height <= 4096 * 4096:
        highest = level.max()
    else:
        side = 256
        xs = np.linspace(0, max(0, level.width - side), 8).astype(int)
        ys = np.linspace(0, max(0, level.height - side), 8).astype(int)
        highest = max(
            level.crop(int(x), int(y), min(side, level.width), min(side, level.height)).max()
            for x in xs
            for y in ys
        )
    return 2 ** bit_depth(float(highest)) - 1


def _to_rgb(pixels: np.ndarray, top: int = 65535) -> np.ndarray:
    """uint8 RGB from a region as a reader decodes it (H x W, or H x W x bands), so every
    slide a reader opens is read as the 8-bit RGB the models were trained on:

    - 16-bit samples are scaled by the slide's bit depth (``round(v * 255 / top)``, ``top``
      its white: :func:`sixteen_bit_top`), one for the whole slide, never a region's own;
    - one band (grayscale, bilevel, a gray palette) is replicated into R, G and B;
    - alpha (grayscale + alpha, RGBA) is composited on white, the slide's padding.
    Palettes and min-is-white are resolved by the decoder (libvips) before this.
    """
    if pixels.ndim == 2:
        pixels = pixels[..., None]
    if pixels.dtype == np.uint16:
        scaled = (pixels.astype(np.uint32) * 255 + top // 2) // top
        pixels = np.minimum(scaled, 255).astype(np.uint8)
    elif pixels.dtype != np.uint8:
        raise UnsupportedSlideError(f"slide samples are {pixels.dtype}; expected 8 or 16 bits")
    bands = pixels.shape[2]
    if bands in (2, 4):  # the last band is alpha
        color = pixels[..., :-1]
        if np.all(pixels[..., -1] == 255):  # opaque (nearly every tile): no composite
            pixels = color
        else:
            a = pixels[..., -1:].astype(np.float32) / 255.0
            mixed = color.astype(np.float32) * a + PAD * (1.0 - a)
            pixels = np.clip(np.rint(mixed), 0, 255).astype(np.uint8)
    if pixels.shape[2] == 1:
        return np.repeat(pixels, 3, axis=2)
    if pixels.shape[2] == 3:
        return np.ascontiguousarray(pixels)
    raise UnsupportedSlideError(f"slide has {bands} bands; expected grayscale or RGB")


def in_slide(x: int, y: int, w: int, h: int, width: int, height: int):
    """(x, y, w, h) of the part of a region that lies on a ``width`` x ``height`` slide, or None
    when none does."""
    x0, y0, x1, y1 = max(x, 0), max(y, 0), min(x + w, width), min(y + h, height)
    return (x0, y0, x1 - x0, y1 - y0) if x0 < x1 and y0 < y1 else None


def padded(inside: np.ndarray | None, box, x: int, y: int, w: int, h: int) -> np.ndarray:
    """The ``w`` x ``h`` region at (``x``, ``y``): ``inside`` (read at ``box``, from
    :func:`in_slide`) with white around it."""
    out = np.full((h, w, 3), PAD, dtype=np.uint8)
    if box is not None:
        bx, by, bw, bh = box
        out[by - y : by - y + bh, bx - x : bx - x + bw] = inside
    return out
