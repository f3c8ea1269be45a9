"""DICOM whole-slide images: a slide is a series of ``.dcm`` instances (one per pyramid level,
plus label and overview) kept in one folder, which OpenSlide (4.0 or newer) reads as one slide.

cyto names such a slide by its folder. Which files form which series is read here from each
file's header, without a DICOM library: the SOP class (only VL Whole Slide Microscopy Image
instances count) and the Series Instance UID, both found before any pixel data, so a folder is
sorted into series in a few kilobytes a file. A folder with two series would be read as
whichever one OpenSlide met first, so it is refused instead.
"""

from __future__ import annotations

import struct
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


def slide_bytes(path: Path) -> int:
    """The size of a slide: its file's, the sum of a DICOM slide's instances (its folder), or a
    remote object's."""
    from cyto.slides.remote import SlideURL, open_object

    if isinstance(path, SlideURL):
        return open_object(path).size
    path = Path(path)
    if path.is_dir():
        return sum(f.stat().st_size for f in slide_instances(path))
    return path.stat().st_size


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
