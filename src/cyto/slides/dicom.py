"""DICOM whole-slide images: a slide is a series of ``.dcm`` instances (one per pyramid level,
plus label and overview) kept in one folder, which OpenSlide (4.0 or newer) reads as one slide.

cyto names such a slide by its folder. Which files form which series is read here from each
file's header, without a DICOM library: the SOP class (only VL Whole Slide Microscopy Image
instances count) and the Series Instance UID, both found before any pixel data, so a folder is
sorted into series in a few kilobytes a file. A folder with two series would be read as
whichever one OpenSlide met first, so it is refused instead.

The geometry of a slide's pyramid (:class:`WsiLevel`, :func:`pyramid`, :func:`downsamples`) is
written here once, from the attributes of its instances by keyword, as OpenSlide's DICOM reader
reads them (which instances are levels, their order, the tile of each frame, the downsample and
the pixel size): the DICOMweb reader (:mod:`cyto.slides.dicomweb`) reads a series from its
metadata with it, and its slide is then the same slide as the local folder, level for level.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from cyto.errors import InputPathError, MissingDependencyError, UnsupportedSlideError

DICOM_SUFFIX = ".dcm"
WSI_SOP_CLASS = "1.2.840.10008.5.1.4.1.1.77.1.6"
_SERIES_UID = (0x0020, 0x000E)
_IMPLICIT_LE = "1.2.840.10008.1.2"  # every other syntax read here is explicit VR little endian
_UNSUPPORTED = ("1.2.840.10008.1.2.1.99", "1.2.840.10008.1.2.2")  # deflated, big endian
_LONG_VRS = {b"OB", b"OD", b"OF", b"OL", b"OV", b"OW", b"SQ", b"SV", b"UC", b"UN", b"UR", b"UT"}
_UNDEFINED = 0xFFFFFFFF
_ITEM_END, _SEQ_END = 0xE00D, 0xE0DD
_HEADER_FIRST = 64 << 10  # the tags read lie in the first few kB
_HEADER_LIMIT = 4 << 20  # private data before them: read on, but stop long before pixel data


#: ImageType's third value of the instances that are pyramid levels (not LABEL, OVERVIEW,
#: THUMBNAIL: the label, the macro image and a thumbnail, which are not scored)
LEVEL_TYPE = "VOLUME"


@dataclass(frozen=True)
class WsiLevel:
    """One pyramid level of a DICOM whole slide: one TILED_FULL instance, its frames the tiles
    row by row (one focal plane, one optical path)."""

    uid: str  # its SOP Instance UID
    width: int  # TotalPixelMatrixColumns
    height: int  # TotalPixelMatrixRows
    tile_w: int  # Columns
    tile_h: int  # Rows
    frames: int  # NumberOfFrames
    samples: int  # SamplesPerPixel
    photometric: str
    spacing: tuple[float, float] | None  # PixelSpacing in mm: (between rows, between columns)

    @property
    def across(self) -> int:
        return -(-self.width // self.tile_w)

    @property
    def down(self) -> int:
        return -(-self.height // self.tile_h)

    def frame(self, tx: int, ty: int) -> int:
        """The frame number (from 1, as WADO-RS counts) of tile column ``tx``, row ``ty``."""
        return ty * self.across + tx + 1

    def tiles(self, x: int, y: int, w: int, h: int) -> list[tuple[int, int]]:
        """(column, row) of the tiles the region (in this level's pixels, inside it) meets."""
        tx0, ty0 = x // self.tile_w, y // self.tile_h
        tx1, ty1 = (x + w - 1) // self.tile_w, (y + h - 1) // self.tile_h
        return [(tx, ty) for ty in range(ty0, ty1 + 1) for tx in range(tx0, tx1 + 1)]


def _first(attrs: dict, key: str, default=None):
    value = attrs.get(key, default)
    if isinstance(value, (list, tuple)):
        return value[0] if value else default
    return value


def level_of(attrs: dict, name: object) -> WsiLevel | None:
    """The pyramid level an instance is (its attributes by DICOM keyword), or None when it is
    not one (a label, an overview, a thumbnail, another class); one line for a level that
    cyto cannot read."""
    if _first(attrs, "SOPClassUID") != WSI_SOP_CLASS:
        return None
    kind = attrs.get("ImageType") or []
    if len(kind) < 3 or str(kind[2]).upper() != LEVEL_TYPE:
        return None
    organization = str(_first(attrs, "DimensionOrganizationType", "TILED_FULL")).upper()
    planes = int(_first(attrs, "TotalPixelMatrixFocalPlanes", 1) or 1)
    paths = int(_first(attrs, "NumberOfOpticalPaths", 1) or 1)
    if organization != "TILED_FULL" or planes != 1 or paths != 1:
        raise UnsupportedSlideError(
            f"{name}: instance {_first(attrs, 'SOPInstanceUID')} is {organization} with "
            f"{planes} focal plane(s) and {paths} optical path(s); cyto reads TILED_FULL "
            "levels of one focal plane and one optical path"
        )
    spacing = attrs.get("PixelSpacing")
    return WsiLevel(
        uid=str(_first(attrs, "SOPInstanceUID")),
        width=int(_first(attrs, "TotalPixelMatrixColumns")),
        height=int(_first(attrs, "TotalPixelMatrixRows")),
        tile_w=int(_first(attrs, "Columns")),
        tile_h=int(_first(attrs, "Rows")),
        frames=int(_first(attrs, "NumberOfFrames", 1) or 1),
        samples=int(_first(attrs, "SamplesPerPixel", 3) or 3),
        photometric=str(_first(attrs, "PhotometricInterpretation", "RGB")),
        spacing=(float(spacing[0]), float(spacing[1])) if spacing and len(spacing) == 2 else None,
    )


def pyramid(instances: list[dict], name: object) -> list[WsiLevel]:
    """The levels of a slide from its instances' attributes, largest first; an instance of a
    size already taken (the same level cut into several instances) is one line."""
    levels = [lv for lv in (level_of(a, name) for a in instances) if lv is not None]
    levels.sort(key=lambda lv: (-lv.width, -lv.height, lv.uid))
    for a, b in zip(levels, levels[1:], strict=False):
        if (a.width, a.height) == (b.width, b.height):
            raise UnsupportedSlideError(
                f"{name}: two instances ({a.uid}, {b.uid}) hold the {a.width} x {a.height} "
                "level; cyto reads a level held by one instance"
            )
    return levels


def downsamples(levels: list[WsiLevel]) -> tuple[float, ...]:
    """Each level's downsample as OpenSlide computes it: the mean of the width's and the
    height's ratio to level 0's."""
    w0, h0 = levels[0].width, levels[0].height
    return tuple((w0 / lv.width + h0 / lv.height) / 2 for lv in levels)


def mpp_of(levels: list[WsiLevel]) -> tuple[float | None, float | None]:
    """(um per pixel across, down) of level 0, from its PixelSpacing (mm), as OpenSlide gives
    ``openslide.mpp-x`` and ``openslide.mpp-y``."""
    spacing = levels[0].spacing
    if spacing is None or spacing[0] <= 0 or spacing[1] <= 0:
        return None, None
    return spacing[1] * 1000.0, spacing[0] * 1000.0


class _Reader:
    """Little-endian DICOM elements from a byte buffer (explicit or implicit VR)."""

    def __init__(self, data: bytes, pos: int, explicit: bool) -> None:
        self.data, self.pos, self.explicit = data, pos, explicit

    def element(self) -> tuple[tuple[int, int], bytes | None, int]:
        """(tag, VR or None, value length) of the element at ``pos``, moved past its header."""
        d, p = self.data, self.pos
        if p + 8 > len(d):
            raise EOFError
        group, elem = struct.unpack_from("<HH", d, p)
        if group == 0xFFFE or not self.explicit:  # item tags never carry a VR
            (length,) = struct.unpack_from("<I", d, p + 4)
            self.pos = p + 8
            return (group, elem), None, length
        vr = d[p + 4 : p + 6]
        if vr in _LONG_VRS:
            if p + 12 > len(d):
                raise EOFError
            (length,) = struct.unpack_from("<I", d, p + 8)
            self.pos = p + 12
        else:
            (length,) = struct.unpack_from("<H", d, p + 6)
            self.pos = p + 8
        return (group, elem), vr, length

    def skip_undefined(self, vr: bytes | None = None) -> None:
        """Past a sequence (or item) of undefined length: its items, to the delimiter. A
        sequence whose VR is UN holds implicit-VR elements, whatever the file's syntax."""
        explicit = self.explicit
        if vr == b"UN":
            self.explicit = False
        try:
            while True:
                tag, inner_vr, length = self.element()
                if tag == (0xFFFE, _SEQ_END) or tag == (0xFFFE, _ITEM_END):
                    return
                if length == _UNDEFINED:
                    self.skip_undefined(inner_vr)
                else:
                    self.pos += length
        finally:
            self.explicit = explicit


def _text(value: bytes) -> str:
    return value.split(b"\0", 1)[0].decode("ascii", "replace").strip()


def series_of(path: Path) -> tuple[str, str] | None:
    """(SOP class UID, Series Instance UID) of a DICOM Part 10 file, from its header; None
    when the file is not one, or its dataset is in a syntax read only by DICOM libraries. The
    first 64 KiB hold it in every file seen; more is read only when they end first. A file
    asked again unchanged (its size and time of change) is answered from memory: a watched
    folder is listed every few seconds."""
    try:
        st = path.stat()
    except OSError:
        return None
    key = (str(Path(path).absolute()), st.st_size, st.st_mtime_ns)
    if key not in _SEEN:
        if len(_SEEN) >= _SEEN_MAX:
            _SEEN.clear()
        _SEEN[key] = _read_series(path)
    return _SEEN[key]


_SEEN: dict[tuple[str, int, int], tuple[str, str] | None] = {}
_SEEN_MAX = 100_000


def _read_series(path: Path) -> tuple[str, str] | None:
    try:
        with open(path, "rb") as fh:
            data = fh.read(_HEADER_FIRST)
            try:
                return _series_in(data)
            except (EOFError, struct.error):
                if len(data) < _HEADER_FIRST:
                    return None  # the whole file was read: truncated
            data += fh.read(_HEADER_LIMIT - len(data))
    except OSError:
        return None
    try:
        return _series_in(data)
    except (EOFError, struct.error):
        return None


def _series_in(data: bytes) -> tuple[str, str] | None:
    """:func:`series_of` on the file's first bytes; EOFError when they end too soon."""
    if len(data) < 132 or data[128:132] != b"DICM":
        return None
    meta = _Reader(data, 132, explicit=True)
    sop_class = syntax = ""
    while True:
        start = meta.pos
        tag, _vr, length = meta.element()
        if tag[0] != 0x0002:
            meta.pos = start
            break
        value = data[meta.pos : meta.pos + length]
        meta.pos += length
        if tag == (0x0002, 0x0002):
            sop_class = _text(value)
        elif tag == (0x0002, 0x0010):
            syntax = _text(value)
    if syntax in _UNSUPPORTED or not syntax:
        return None
    body = _Reader(data, meta.pos, explicit=syntax != _IMPLICIT_LE)
    while True:
        tag, vr, length = body.element()
        if tag > _SERIES_UID:
            return None
        if tag == _SERIES_UID:
            if body.pos + length > len(data):
                raise EOFError
            return sop_class, _text(data[body.pos : body.pos + length])
        if length == _UNDEFINED:
            body.skip_undefined(vr)
        else:
            body.pos += length


def is_dicom_file(path: Path) -> bool:
    """A ``.dcm`` file, or a file without a suffix (as DICOM exports often name them) that
    starts as a DICOM Part 10 file does."""
    if not path.is_file():
        return False
    if path.suffix.lower() == DICOM_SUFFIX:
        return True
    if path.suffix:
        return False
    try:
        with open(path, "rb") as fh:
            return fh.read(132)[128:132] == b"DICM"
    except OSError:
        return False


def dicom_files(folder: Path) -> list[Path]:
    """The DICOM files directly in ``folder`` (:func:`is_dicom_file`), by name."""
    try:
        return sorted(f for f in folder.iterdir() if is_dicom_file(f))
    except OSError:
        return []


def wsi_series(folder: Path) -> dict[str, list[Path]]:
    """The whole-slide series in ``folder``: Series Instance UID -> its image files, by name."""
    series: dict[str, list[Path]] = {}
    for f in dicom_files(folder):
        found = series_of(f)
        if found is not None and found[0] == WSI_SOP_CLASS and found[1]:
            series.setdefault(found[1], []).append(f)
    return series


def slide_instances(folder: Path) -> list[Path]:
    """The files of the one DICOM whole slide in ``folder``; a one-line error when it holds
    none or several."""
    series = wsi_series(folder)
    if not series:
        raise InputPathError(
            f"slide {folder} is a folder without a DICOM whole-slide image in it (no .dcm file "
            "of the VL Whole Slide Microscopy Image class); other slide formats are files"
        )
    if len(series) > 1:
        raise InputPathError(
            f"slide {folder} holds {len(series)} DICOM whole slides (series "
            f"{', '.join(sorted(series))}): give each slide its own folder"
        )
    return next(iter(series.values()))


def entry_file(files: list[Path]) -> Path:
    """The instance OpenSlide is opened with: the largest (the full-resolution level)."""
    return max(files, key=lambda f: (f.stat().st_size, f.name))


def reads_dicom(openslide) -> bool:
    """Whether this openslide-python module's OpenSlide has the DICOM reader (4.0 or newer)."""
    try:
        return int(str(getattr(openslide, "__library_version__", "0")).split(".")[0]) >= 4
    except ValueError:
        return False


def check_openslide(openslide, path: Path) -> None:
    """DICOM needs openslide-python over OpenSlide 4.0 or newer (openslide-bin)."""
    if openslide is None:
        raise MissingDependencyError(
            "openslide-python", f"reading the DICOM slide {path}", "pip install openslide-bin"
        )
    if not reads_dicom(openslide):
        version = getattr(openslide, "__library_version__", "0")
        raise UnsupportedSlideError(
            f"{path}: a DICOM whole slide needs OpenSlide 4.0 or newer; this openslide-python "
            f"uses OpenSlide {version} (pip install openslide-bin)"
        )
