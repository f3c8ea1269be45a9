"""Decoding cell images to uint8 RGB, whatever their format, mode or size."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from cyto.errors import UnreadableImageError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".tif", ".tiff", ".bmp")


def decode_image(data: bytes, path: Path | str = "<bytes>") -> np.ndarray:
    """Decode image bytes to an ``(H, W, 3)`` uint8 RGB array.

    Grayscale is replicated to three channels; alpha is composited onto white (the colour of empty
    glass); 16-bit images are scaled to 8 bits.

    Raises:
        UnreadableImageError: the bytes are not a complete image.
    """
    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            return _to_rgb(im)
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise UnreadableImageError(path, str(exc) or type(exc).__name__) from exc


def _to_rgb(im: Image.Image) -> np.ndarray:
    if im.mode in ("I;16", "I;16B", "I;16L", "I"):
        arr = np.asarray(im, dtype=np.float64)
        hi = float(arr.max()) or 1.0
        scale = 255.0 / (65535.0 if hi > 255 else 255.0)
        gray = np.clip(np.rint(arr * scale), 0, 255).astype(np.uint8)
        return np.repeat(gray[..., None], 3, axis=2)
    if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
        rgba = np.asarray(im.convert("RGBA"), dtype=np.float32)
        alpha = rgba[..., 3:4] / 255.0
        rgb = rgba[..., :3] * alpha + 255.0 * (1.0 - alpha)
        return np.clip(np.rint(rgb), 0, 255).astype(np.uint8)
    if im.mode != "RGB":
        im = im.convert("RGB")
    arr = np.asarray(im, dtype=np.uint8)
    return np.ascontiguousarray(arr)


def read_image(path: Path | str) -> np.ndarray:
    """Read one image file as ``(H, W, 3)`` uint8 RGB (see :func:`decode_image`)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UnreadableImageError(path, exc.strerror or str(exc)) from exc
    return decode_image(data, path)


def square_rgb(img: np.ndarray) -> np.ndarray:
    """A non-square image made square without resampling: centred on a canvas of its longer
    side, filled with the median colour of its edge (the glass or cytoplasm around the cell).
    A cell crop cut at the edge of its image (CRIC: 100 x 46 px and the like) keeps its cell's
    shape and scale; stretched to a square, its nucleus grew 2x along one axis."""
    h, w = img.shape[:2]
    if h == w:
        return img
    side = max(h, w)
    edge = np.concatenate([img[0], img[-1], img[:, 0], img[:, -1]])
    canvas = np.empty((side, side, 3), dtype=np.uint8)
    canvas[:] = np.median(edge, axis=0).astype(np.uint8)
    y0, x0 = (side - h) // 2, (side - w) // 2
    canvas[y0 : y0 + h, x0 : x0 + w] = img
    return canvas


def resize_rgb(img: np.ndarray, size: int) -> np.ndarray:
    """Resize to ``size x size`` (area filter when shrinking, bicubic when enlarging); a
    non-square image is made square first (:func:`square_rgb`), never stretched."""
    img = square_rgb(img)
    if img.shape[0] == size and img.shape[1] == size:
        return img
    shrink = img.shape[0] > size or img.shape[1] > size
    resample = Image.Resampling.BOX if shrink else Image.Resampling.BICUBIC
    return np.asarray(Image.fromarray(img).resize((size, size), resample), dtype=np.uint8)
