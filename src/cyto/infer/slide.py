"""Whole-slide readers: pyvips (tiffload; openslideload where libvips has it) and OpenSlide.

``open_slide(path)`` picks a backend: OpenSlide-format files (NDPI, SVS, MRXS, ...) go through
libvips' openslideload when it exists, else openslide-python; plain tiled TIFF and OME-TIFF go
through tiffload. Regions come back as uint8 RGB (alpha composited on white), and reads outside
the slide are padded with white, so a caller can cut cells at slide edges without special cases.
A missing, truncated, unsupported or non-slide file gives one :class:`UnsupportedSlideError` (or
:class:`InputPathError`) naming the file and the reason.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from cyto.errors import InputPathError, MissingDependencyError, UnsupportedSlideError

BACKENDS = ("auto", "pyvips", "openslide")
PAD = 255


def _load_libraries() -> tuple[object | None, object | None]:
    """(openslide, pyvips) modules or None; openslide first, so it binds its own library before
    libvips (linked to the system OpenSlide) is loaded into the process."""
    openslide = pyvips = None
    if importlib.util.find_spec("openslide") is not None:
        try:
            import openslide as _os

            openslide = _os
        except (ImportError, OSError):
            openslide = None
    try:
        import pyvips as _pv

        pyvips = _pv
        # every region is read once: libvips' operation cache only holds memory here
        pyvips.cache_set_max(0)
    except (ImportError, OSError):
        pyvips = None
    return openslide, pyvips


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


def _float(value: object) -> float | None:
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return v if v > 0 else None


def _to_rgb(rgba: np.ndarray) -> np.ndarray:
    if rgba.shape[2] == 3:
        return np.ascontiguousarray(rgba)
    if rgba.shape[2] == 4:
        a = rgba[..., 3:4].astype(np.float32) / 255.0
        rgb = rgba[..., :3].astype(np.float32) * a + PAD * (1.0 - a)
        return np.clip(np.rint(rgb), 0, 255).astype(np.uint8)
    if rgba.shape[2] == 1:
        return np.repeat(rgba, 3, axis=2)
    raise UnsupportedSlideError(f"slide has {rgba.shape[2]} bands; expected RGB")


def _padded(read, x: int, y: int, w: int, h: int, width: int, height: int) -> np.ndarray:
    """Read the in-bounds part with ``read(x, y, w, h)`` and pad the rest with white."""
    out = np.full((h, w, 3), PAD, dtype=np.uint8)
    x0, y0, x1, y1 = max(x, 0), max(y, 0), min(x + w, width), min(y + h, height)
    if x0 < x1 and y0 < y1:
        out[y0 - y : y1 - y, x0 - x : x1 - x] = read(x0, y0, x1 - x0, y1 - y0)
    return out


class OpenSlideReader:
    def __init__(self, path: Path, openslide) -> None:
        try:
            self._s = openslide.OpenSlide(str(path))
        except (openslide.OpenSlideError, openslide.OpenSlideUnsupportedFormatError) as exc:
            raise UnsupportedSlideError(f"{path}: OpenSlide cannot read it ({exc})") from exc
        p = dict(self._s.properties)
        self.info = SlideInfo(
            path=path,
            backend="openslide",
            vendor=p.get("openslide.vendor", "unknown"),
            width=self._s.dimensions[0],
            height=self._s.dimensions[1],
            level_dims=tuple(self._s.level_dimensions),
            level_downsamples=tuple(float(d) for d in self._s.level_downsamples),
            mpp=_float(p.get("openslide.mpp-x")),
            objective=_float(p.get("openslide.objective-power")),
            properties=p,
        )
        self._error = openslide.OpenSlideError

    def read_region(self, x: int, y: int, w: int, h: int, level: int = 0) -> np.ndarray:
        ds = self.info.level_downsamples[level]
        lw, lh = self.info.level_dims[level]

        def read(rx, ry, rw, rh):
            try:
                img = self._s.read_region((int(rx * ds), int(ry * ds)), level, (rw, rh))
            except self._error as exc:
                raise UnsupportedSlideError(
                    f"{self.info.path}: cannot read region at ({rx}, {ry}) level {level}: {exc}"
                ) from exc
            return _to_rgb(np.asarray(img))

        return _padded(read, x, y, w, h, lw, lh)

    def close(self) -> None:
        self._s.close()


class PyvipsReader:
    def __init__(self, path: Path, pyvips, vendor: str | None) -> None:
        self._pv = pyvips
        self.path = path
        try:
            if vendor is not None:
                self._levels = [pyvips.Image.openslideload(str(path), level=0)]
                n = int(self._levels[0].get("openslide.level-count"))
                self._levels += [
                    pyvips.Image.openslideload(str(path), level=i) for i in range(1, n)
                ]
            else:
                first = pyvips.Image.new_from_file(str(path), access="random")
                n = first.get_n_pages() if first.get("vips-loader").startswith("tiff") else 1
                self._levels = [first] + [
                    pyvips.Image.new_from_file(str(path), page=i, access="random")
                    for i in range(1, n)
                ]
        except pyvips.Error as exc:
            raise UnsupportedSlideError(
                f"{path}: libvips cannot read it ({str(exc).strip().splitlines()[0]})"
            ) from exc
        base = self._levels[0]
        self._levels = [im for im in self._levels if im.width <= base.width]
        fields = set(base.get_fields())
        props = {k: str(base.get(k)) for k in fields if k.startswith(("openslide.", "tiff."))}
        mpp = _float(props.get("openslide.mpp-x"))
        if mpp is None and vendor is None and base.xres > 1.0:
            mpp = 1000.0 / base.xres  # libvips reports pixels per millimetre
        self.info = SlideInfo(
            path=path,
            backend=f"pyvips-{base.get('vips-loader')}",
            vendor=vendor or "generic-tiff",
            width=base.width,
            height=base.height,
            level_dims=tuple((im.width, im.height) for im in self._levels),
            level_downsamples=tuple(base.width / im.width for im in self._levels),
            mpp=mpp,
            objective=_float(props.get("openslide.objective-power")),
            properties=props,
        )

    def read_region(self, x: int, y: int, w: int, h: int, level: int = 0) -> np.ndarray:
        im = self._levels[level]

        def read(rx, ry, rw, rh):
            try:
                return _to_rgb(im.crop(rx, ry, rw, rh).numpy())
            except self._pv.Error as exc:
                raise UnsupportedSlideError(
                    f"{self.path}: cannot read region at ({rx}, {ry}) "
                    f"level {level}: {str(exc).strip()[:200]}"
                ) from exc

        return _padded(read, x, y, w, h, im.width, im.height)

    def close(self) -> None:
        self._levels = []


def open_slide(path: Path | str, backend: str = "auto") -> SlideReader:
    """Open a whole-slide image with the best available backend (see the module docstring)."""
    path = Path(path)
    if backend not in BACKENDS:
        raise UnsupportedSlideError(
            f"unknown slide backend {backend!r}; use one of {', '.join(BACKENDS)}"
        )
    if not path.exists():
        raise InputPathError(f"slide {path} does not exist")
    if not path.is_file():
        raise InputPathError(f"slide {path} is not a file")
    if path.stat().st_size < 16:
        raise UnsupportedSlideError(
            f"{path}: empty or truncated file ({path.stat().st_size} bytes)"
        )
    openslide, pyvips = _load_libraries()
    if openslide is None and pyvips is None:
        raise MissingDependencyError(
            "pyvips or openslide-python",
            "reading slides",
            "pip install openslide-python openslide-bin, or apt install libvips42",
        )
    vendor = None
    if openslide is not None:
        try:
            vendor = openslide.OpenSlide.detect_format(str(path))
        except Exception:  # noqa: BLE001 - a broken file is diagnosed by the open below
            vendor = None
    if vendor == "generic-tiff":
        vendor = None
    head = path.read_bytes()[:4]
    if vendor is None and head not in (b"II*\0", b"MM\0*", b"II+\0", b"MM\0+"):
        raise UnsupportedSlideError(
            f"{path}: not a whole-slide image (neither a TIFF nor a format OpenSlide recognizes)"
        )
    vips_openslide = pyvips is not None and bool(pyvips.type_find("VipsForeign", "openslideload"))
    if backend == "openslide" or (backend == "auto" and vendor and not vips_openslide):
        if openslide is None:
            raise MissingDependencyError(
                "openslide-python",
                f"reading {path.name}",
                "pip install openslide-python openslide-bin",
            )
        return OpenSlideReader(path, openslide)
    if pyvips is None:
        if openslide is not None:
            return OpenSlideReader(path, openslide)
        raise MissingDependencyError("pyvips", f"reading {path.name}", "apt install libvips42")
    if vendor and not vips_openslide:
        raise UnsupportedSlideError(
            f"{path}: a {vendor} slide, but this libvips has no "
            "openslideload; use --backend openslide"
        )
    return PyvipsReader(path, pyvips, vendor)
