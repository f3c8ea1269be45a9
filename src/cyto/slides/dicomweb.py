"""DICOMweb: a whole slide read from an archive's series without a local copy.

``dicomweb+https://server/prefix/studies/STUDY/series/SERIES`` names the series of one slide.
Its instances are described by one WADO-RS metadata request (``.../series/SERIES/metadata``,
DICOM JSON); the levels and their tiles come from that description through the geometry the
local DICOM reader shares (:func:`cyto.slides.dicom.pyramid`), so a series read here is the
slide its files are read as locally, level for level. Tiles are WADO-RS frames
(``.../instances/UID/frames/1,2,...``), fetched only when a region needs them (all of a region's
missing tiles of one level in one request), asked for as stored
(``multipart/related; type="application/octet-stream"; transfer-syntax=*``) and decoded here:
uncompressed frames as they are, baseline JPEG through Pillow. A server that answers one frame
without a multipart body is read a frame a request.

Plain HTTP (the standard library's urllib): DICOMweb is a few GET requests, and the libraries
made for it (dicomweb-client, wsidicom) would add a dependency and their own HTTP sessions for
what is here about a hundred lines; the retries, the one-line faults and the bearer token
(``CYTO_BEARER_TOKEN``) are those of every remote slide (:class:`cyto.slides.remote.Requests`).

The identity of the slide (resume, caches) is its Study, Series and SOP Instance UIDs and the
number of its instances: a series given another instance, or one taken away, is another slide,
and one that changes while it is scored stops that slide (:class:`SlideChangedError`).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import threading
import urllib.error
import urllib.request
from collections import OrderedDict
from urllib.parse import unquote, urlsplit

import numpy as np

from cyto.envvars import env_text
from cyto.errors import InputPathError, UnsupportedSlideError
from cyto.slides.base import SlideInfo, _to_rgb, in_slide, padded
from cyto.slides.dicom import WSI_SOP_CLASS, WsiLevel, downsamples, mpp_of, pyramid
from cyto.slides.remote import (
    CACHE_BYTES,
    OPENERS,
    TOKEN_ENV,
    Requests,
    SlideChangedError,
    SlideURL,
    bound_shared,
    claim,
    has_authorization,
    open_object,
    release,
    share,
    shared,
    timeout,
)

_SERIES_PATH = re.compile(r"^(?P<prefix>.*?)/studies/(?P<study>[^/]+)/series/(?P<series>[^/]+)/?$")
#: DICOM JSON tags read, by keyword (the nested PixelSpacing is found under its sequences)
_TAGS = {
    "00080008": "ImageType",
    "00080016": "SOPClassUID",
    "00080018": "SOPInstanceUID",
    "0020000D": "StudyInstanceUID",
    "0020000E": "SeriesInstanceUID",
    "00209311": "DimensionOrganizationType",
    "00480006": "TotalPixelMatrixColumns",
    "00480007": "TotalPixelMatrixRows",
    "00480302": "NumberOfOpticalPaths",
    "00480303": "TotalPixelMatrixFocalPlanes",
    "00280002": "SamplesPerPixel",
    "00280004": "PhotometricInterpretation",
    "00280008": "NumberOfFrames",
    "00280010": "Rows",
    "00280011": "Columns",
    "00280100": "BitsAllocated",
    "00020010": "TransferSyntaxUID",
}
_SHARED_GROUPS, _PIXEL_MEASURES, _PIXEL_SPACING = "52009229", "00289110", "00280030"
FRAMES_ACCEPT = 'multipart/related; type="application/octet-stream"; transfer-syntax=*'
_UNCOMPRESSED = ("1.2.840.10008.1.2.1", "1.2.840.10008.1.2")
_JPEG = ("1.2.840.10008.1.2.4.50", "1.2.840.10008.1.2.4.51")  # baseline, extended
_SYNTAX_NAMES = {
    "1.2.840.10008.1.2.4.90": "JPEG 2000 (lossless)",
    "1.2.840.10008.1.2.4.91": "JPEG 2000",
    "1.2.840.10008.1.2.4.70": "lossless JPEG",
    "1.2.840.10008.1.2.4.80": "JPEG-LS (lossless)",
    "1.2.840.10008.1.2.4.81": "JPEG-LS",
    "1.2.840.10008.1.2.5": "RLE",
}


def _value(element: dict):
    values = element.get("Value")
    return values if values else None


def attributes(dataset: dict) -> dict:
    """The attributes :func:`cyto.slides.dicom.pyramid` reads, by keyword, from one instance's
    DICOM JSON (PS3.18 F.2)."""
    out = {kw: _value(dataset.get(tag) or {}) for tag, kw in _TAGS.items()}
    out = {k: v for k, v in out.items() if v is not None}
    for group in _value(dataset.get(_SHARED_GROUPS) or {}) or []:
        for measures in _value(group.get(_PIXEL_MEASURES) or {}) or []:
            spacing = _value(measures.get(_PIXEL_SPACING) or {})
            if spacing:
                out["PixelSpacing"] = [float(v) for v in spacing]
    return out


def _multipart(body: bytes, content_type: str) -> list[tuple[dict, bytes]]:
    """The parts of a ``multipart/related`` body: (headers, content) each."""
    m = re.search(r'boundary="?([^";]+)"?', content_type)
    if m is None:
        raise ValueError("a multipart answer without a boundary")
    delimiter = b"--" + m.group(1).encode("latin-1")
    parts = []
    for chunk in body.split(delimiter)[1:]:
        if chunk.startswith(b"--"):
            break  # the closing delimiter
        head, sep, content = chunk.partition(b"\r\n\r\n")
        if not sep:
            continue
        headers = {}
        for line in head.decode("latin-1").split("\r\n"):
            key, colon, value = line.partition(":")
            if colon:
                headers[key.strip().lower()] = value.strip()
        if content.endswith(b"\r\n"):
            content = content[:-2]
        parts.append((headers, content))
    return parts


def _syntax(content_type: str) -> str | None:
    m = re.search(r"transfer-syntax=([0-9.]+)", content_type)
    if m:
        return m.group(1)
    return _JPEG[0] if "image/jpeg" in content_type else None


class _Status(OSError):
    """An HTTP error answer, its status where :mod:`cyto.slides.remote` looks for one."""

    def __init__(self, status: int, url: str) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


class DicomWebSeries(Requests):
    """The series of one slide on a DICOMweb server (see the module docstring): its levels, and
    its frames through a bounded cache of decoded tiles. Thread-safe."""

    def __init__(self, ref: SlideURL, cache_bytes: int = CACHE_BYTES) -> None:
        self.ref = ref
        parts = urlsplit(ref.url)
        m = _SERIES_PATH.match(parts.path)
        if m is None:
            raise InputPathError(
                f"{ref}: a DICOMweb URL names one series: "
                "dicomweb+https://SERVER/PREFIX/studies/STUDY_UID/series/SERIES_UID"
            )
        user, _, host = parts.netloc.rpartition("@")
        self.root = f"{ref.scheme.split('+', 1)[1]}://{host}{m.group('prefix')}"
        self.query = parts.query
        self.study, self.series = unquote(m.group("study")), unquote(m.group("series"))
        # --storage-option headers={...} first (as an https:// slide's): what a read-back
        # command is given, since a table records the URL without its user info
        given = ref.options.get("headers") or {}
        self.headers = {str(k): str(v) for k, v in given.items()} if isinstance(given, dict) else {}
        token = env_text(TOKEN_ENV)
        if has_authorization(self.headers):
            pass
        elif token:
            self.headers["Authorization"] = f"Bearer {token}"
        elif user:
            basic = base64.b64encode(unquote(user).encode()).decode()
            self.headers["Authorization"] = f"Basic {basic}"
        self._lock = threading.Lock()
        self._tiles: OrderedDict[tuple[int, int, int], np.ndarray] = OrderedDict()
        self._tile_bytes = 0
        self.cache_bytes = cache_bytes
        self.fetched_bytes = 0  # bytes of the answers that came over the network
        self.requests = 0
        self._shared = None  # the frames shared by the processes reading it (shared())
        self._count = threading.Lock()
        self._accept = FRAMES_ACCEPT
        try:
            instances = self._call(lambda: self._json(self._series_url("metadata")), "metadata")
        except InputPathError as exc:
            if str(exc) != f"{ref}: not found (404)":
                raise
            raise InputPathError(f"{ref}: not found (404): {self._what_is_missing()}") from None
        if not isinstance(instances, list) or not instances:
            raise InputPathError(f"{ref}: no such series on the server (no instance in it)")
        described = [attributes(d) for d in instances]
        self.instance_uids = sorted(str(a.get("SOPInstanceUID", [""])[0]) for a in described)
        classes = sorted({str(a.get("SOPClassUID", ["?"])[0]) for a in described})
        if WSI_SOP_CLASS not in classes:
            raise UnsupportedSlideError(
                f"{ref}: not a whole slide: its {len(described)} instance(s) are of SOP class "
                f"{', '.join(classes)}, none a VL Whole Slide Microscopy Image "
                f"({WSI_SOP_CLASS})"
            )
        self.levels: list[WsiLevel] = pyramid(described, ref)
        if not self.levels:
            raise UnsupportedSlideError(
                f"{ref}: a whole-slide series without a pyramid level (no VOLUME instance: "
                "only a label, an overview or a thumbnail)"
            )
        for lv in self.levels:
            a = next(d for d in described if d.get("SOPInstanceUID", [""])[0] == lv.uid)
            bits = int((a.get("BitsAllocated") or [8])[0])
            if bits != 8 or lv.samples not in (1, 3):
                raise UnsupportedSlideError(
                    f"{ref}: level {lv.width} x {lv.height} has {lv.samples} sample(s) of "
                    f"{bits} bits; cyto reads 8-bit RGB and grayscale DICOM slides"
                )
        # the size the pipeline records: the levels' pixels as decoded (DICOMweb metadata
        # does not tell the stored instances' sizes)
        self.size = sum(lv.width * lv.height * lv.samples for lv in self.levels)
        self.etag = "uids:" + self._uid_digest()[:32]
        self.version = None
        self.check_pin(ref)

    def _what_is_missing(self) -> str:
        """Which part of a series URL the server does not know, asked of it (QIDO-RS, one
        request each, no retries): the series in the study, the study, or the DICOMweb root
        itself. A 404 read the same for a wrong study, series or root (hostile round 49, 4)."""

        def found(url: str, none_is_404: bool = False) -> list | None:
            """The answers of a search (an empty list for none, and for a 404 where
            ``none_is_404``), None where it is not one."""
            try:
                body, _ = self._get(url, "application/dicom+json")
            except _Status as exc:
                # (told by the URL's end, a query string after /series made it no search)
                return [] if exc.status in (204, 404) and none_is_404 else None
            except OSError:
                return None
            try:
                answer = json.loads(body) if body.strip() else []
            except ValueError:
                return None
            return answer if isinstance(answer, list) else None

        query = f"?{self.query}" if self.query else ""
        series = found(f"{self.root}/studies/{self.study}/series{query}", none_is_404=True)
        if series:
            return (
                f"the study {self.study} holds no series {self.series} ({len(series)} other "
                "series in it): check the series UID"
            )
        if series is not None and found(f"{self.root}/studies?limit=1") is not None:
            return f"no study {self.study} on the server: check the study UID"
        # a server without searches (QIDO-RS) may serve metadata and frames all the same: it
        # cannot be asked which part is wrong (round 52, 2: "check the root" of a right root)
        return (
            f"{self.root} answers no DICOMweb search (QIDO-RS), so which part is unknown "
            "cannot be asked: check the study UID, the series UID and the DICOMweb root "
            "(Orthanc's is /dicom-web)"
        )

    # -- identity ---------------------------------------------------------------------------
    def _uid_digest(self) -> str:
        text = "\t".join([self.study, self.series, str(len(self.instance_uids))])
        text += "\n" + "\n".join(self.instance_uids)
        return hashlib.sha256(text.encode()).hexdigest()

    def identity(self) -> str:
        """The slide's identity for resume and caches: its Study, Series and SOP Instance UIDs
        and the number of its instances (the same series on another server is the same
        slide)."""
        text = f"cyto-slide-identity-v1:dicomweb\t{self._uid_digest()}"
        return hashlib.sha256(text.encode()).hexdigest()

    def check_pin(self, ref: SlideURL) -> None:
        if ref.etag is not None and ref.etag != self.etag:
            raise SlideChangedError(
                f"{ref}: the series changed while it was scored (its instances are not those "
                "it held when the run began); nothing of this run of it is kept: score it again"
            )

    # -- HTTP -------------------------------------------------------------------------------
    def _series_url(self, tail: str) -> str:
        url = f"{self.root}/studies/{self.study}/series/{self.series}/{tail}"
        return f"{url}?{self.query}" if self.query else url

    def _get(self, url: str, accept: str) -> tuple[bytes, str]:
        """(body, Content-Type) of a GET; an error answer as :class:`_Status`, a dropped or
        refused connection as the OSError behind it (retried by :meth:`_call`)."""
        req = urllib.request.Request(url, headers={**self.headers, "Accept": accept})
        try:
            with urllib.request.urlopen(req, timeout=timeout()) as resp:
                body = resp.read()
                kind = resp.headers.get("Content-Type", "")
        except urllib.error.HTTPError as exc:
            exc.close()
            raise _Status(exc.code, url) from None
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, BaseException):
                raise reason from None
            raise ConnectionError(str(reason)) from None
        with self._count:
            self.requests += 1
            self.fetched_bytes += len(body)
        return body, kind

    def _json(self, url: str):
        body, _ = self._get(url, "application/dicom+json")
        return json.loads(body)

    def _frames(self, level: WsiLevel, numbers: list[int]) -> list[tuple[bytes, str | None]]:
        """(bytes, transfer syntax) of frames ``numbers`` of ``level``'s instance, in order."""
        url = self._series_url(f"instances/{level.uid}/frames/{','.join(map(str, numbers))}")

        def get():
            try:
                return self._get(url, self._accept)
            except _Status as exc:
                if exc.status != 406 or self._accept != FRAMES_ACCEPT:
                    raise
                # a server that cannot send frames as stored: as it sends them by default
                self._accept = 'multipart/related; type="application/octet-stream"'
                return self._get(url, self._accept)

        body, kind = self._call(get, "frames")
        if "multipart/" not in kind.lower():
            if len(numbers) == 1:
                return [(body, _syntax(kind))]
            return [f for n in numbers for f in self._frames(level, [n])]
        parts = _multipart(body, kind)
        if len(parts) != len(numbers):
            if len(numbers) > 1:
                return [f for n in numbers for f in self._frames(level, [n])]
            raise SlideChangedError(
                f"{self.ref}: asked for frame {numbers[0]} of instance {level.uid} and got "
                f"{len(parts)} parts"
            )
        outer = _syntax(kind)
        return [(content, _syntax(h.get("content-type", "")) or outer) for h, content in parts]

    # -- tiles ------------------------------------------------------------------------------
    def _decode(self, level: WsiLevel, data: bytes, syntax: str | None) -> np.ndarray:
        shape = (level.tile_h, level.tile_w, level.samples)
        raw = level.tile_h * level.tile_w * level.samples
        if syntax in _UNCOMPRESSED or (syntax is None and len(data) in (raw, raw + 1)):
            if len(data) < raw:
                raise UnsupportedSlideError(
                    f"{self.ref}: a frame of instance {level.uid} holds {len(data)} bytes, not "
                    f"the {raw} of a {level.tile_w} x {level.tile_h} tile"
                )
            if level.samples == 3 and level.photometric not in ("RGB",):
                raise UnsupportedSlideError(
                    f"{self.ref}: uncompressed frames in {level.photometric}; cyto reads "
                    "uncompressed RGB and grayscale"
                )
            return np.frombuffer(data[:raw], np.uint8).reshape(shape)
        if syntax in _JPEG or (syntax is None and data[:2] == b"\xff\xd8"):
            from PIL import Image

            with Image.open(io.BytesIO(data)) as im:
                im = im.convert("RGB" if level.samples == 3 else "L")
                return np.asarray(im).reshape(shape)
        name = _SYNTAX_NAMES.get(syntax or "", syntax or "an unnamed transfer syntax")
        raise UnsupportedSlideError(
            f"{self.ref}: its frames are {name}; cyto decodes uncompressed and JPEG frames "
            "from DICOMweb (ask the archive for JPEG, or score a local copy)"
        )

    def shared(self):
        """The folder of this series' frames that every process reading it shares (as
        :meth:`cyto.slides.remote.RemoteObject.shared` does for blocks): a frame the plan or
        the read-ahead fetched is not fetched again by a worker, nor by two workers."""
        if self._shared is None:
            from pathlib import Path

            from cyto.cachedir import cache_dir

            self._shared = Path(cache_dir()) / "remote-blocks" / self.identity()[:32]
            self._shared.mkdir(parents=True, exist_ok=True)
        return self._shared

    @staticmethod
    def _name(index: int, tile: tuple[int, int]) -> str:
        return f"{index}-{tile[0]}-{tile[1]}.frm"

    def _from_shared(self, index: int, tile: tuple[int, int]) -> tuple[bytes, str | None] | None:
        """(bytes, transfer syntax) of a shared frame, if it is there."""
        raw = shared(self.shared(), self._name(index, tile))
        if raw is None:
            return None
        syntax, _, data = raw.partition(b"\n")
        return data, (syntax.decode() or None)

    def _fetch_shared(self, index: int, tiles: list[tuple[int, int]], locked: bool = True) -> dict:
        """Fetch ``tiles`` of level ``index`` in one request and share them; (bytes, syntax)
        by tile. ``locked``: this process holds their locks (released here)."""
        if not tiles:
            return {}
        level, folder = self.levels[index], self.shared()
        try:
            frames = self._frames(level, [level.frame(tx, ty) for tx, ty in tiles])
            for t, (data, syntax) in zip(tiles, frames, strict=True):
                share(folder, self._name(index, t), (syntax or "").encode() + b"\n" + data)
        finally:
            if locked:
                release(folder, [self._name(index, t) for t in tiles])
        bound_shared(folder.parent)
        return dict(zip(tiles, frames, strict=True))

    def prefetch(self, index: int, wanted: list[tuple[int, int]]) -> int:
        """Fetch the frames of ``wanted`` (level ``index``) that no process holds or is
        fetching into the shared folder, in one request (read-ahead,
        :mod:`cyto.slides.ahead`); the bytes that came over the network."""
        folder = self.shared()
        todo = [t for t in wanted if not (folder / self._name(index, t)).exists()]
        mine = set(claim(folder, [self._name(index, t) for t in todo], wait=False))
        got = self._fetch_shared(index, [t for t in todo if self._name(index, t) in mine])
        return sum(len(data) for data, _ in got.values())

    def tiles(self, index: int, wanted: list[tuple[int, int]]) -> dict:
        """Decoded tiles (column, row) -> uint8 array of level ``index``: from this process's
        cache, else the shared folder, else fetched (the missing ones in one request)."""
        level = self.levels[index]
        with self._lock:
            have = {t: self._tiles[(index, *t)] for t in wanted if (index, *t) in self._tiles}
            missing = [t for t in wanted if t not in have]
            raw = {t: f for t in missing if (f := self._from_shared(index, t)) is not None}
            missing = [t for t in missing if t not in raw]
            if missing:
                folder = self.shared()
                mine = set(claim(folder, [self._name(index, t) for t in missing], wait=True))
                raw.update(
                    self._fetch_shared(index, [t for t in missing if self._name(index, t) in mine])
                )
                for t in missing:  # those another process fetched meanwhile
                    if t not in raw and (f := self._from_shared(index, t)) is not None:
                        raw[t] = f
                late = [t for t in missing if t not in raw]  # evicted again: fetched here
                raw.update(self._fetch_shared(index, late, locked=False))
            for t, (data, syntax) in raw.items():
                tile = self._decode(level, data, syntax)
                have[t] = tile
                self._tiles[(index, *t)] = tile
                self._tile_bytes += tile.nbytes
            for t in wanted:
                self._tiles.move_to_end((index, *t))
            while self._tile_bytes > self.cache_bytes and len(self._tiles) > len(wanted):
                _, old = self._tiles.popitem(last=False)
                self._tile_bytes -= old.nbytes
        return have


class DicomWebReader:
    """A slide reader (:class:`cyto.slides.base.SlideReader`) over a DICOMweb series."""

    def __init__(self, ref: SlideURL) -> None:
        self.series: DicomWebSeries = open_object(ref)
        levels = self.series.levels
        mpp_x, mpp_y = mpp_of(levels)
        props = {
            "openslide.vendor": "dicom",
            "dicom.StudyInstanceUID": self.series.study,
            "dicom.SeriesInstanceUID": self.series.series,
        }
        if mpp_x is not None:
            props["openslide.mpp-x"], props["openslide.mpp-y"] = repr(mpp_x), repr(mpp_y)
        self.info = SlideInfo(
            path=ref,
            backend="dicomweb",
            vendor="dicom",
            width=levels[0].width,
            height=levels[0].height,
            level_dims=tuple((lv.width, lv.height) for lv in levels),
            level_downsamples=downsamples(levels),
            mpp=mpp_x,
            objective=None,
            properties=props,
        )

    def read_region(self, x: int, y: int, w: int, h: int, level: int = 0) -> np.ndarray:
        lv = self.series.levels[level]
        box = in_slide(x, y, w, h, lv.width, lv.height)
        if box is None:
            return padded(None, None, x, y, w, h)
        bx, by, bw, bh = box
        wanted = lv.tiles(bx, by, bw, bh)
        tiles = self.series.tiles(level, wanted)
        out = np.empty((bh, bw, lv.samples), np.uint8)
        for (tx, ty), tile in tiles.items():
            x0, y0 = tx * lv.tile_w, ty * lv.tile_h
            ix0, iy0 = max(bx, x0), max(by, y0)
            ix1, iy1 = min(bx + bw, x0 + lv.tile_w), min(by + bh, y0 + lv.tile_h)
            out[iy0 - by : iy1 - by, ix0 - bx : ix1 - bx] = tile[
                iy0 - y0 : iy1 - y0, ix0 - x0 : ix1 - x0
            ]
        return padded(_to_rgb(out), box, x, y, w, h)

    def close(self) -> None:
        pass


OPENERS["dicomweb"] = DicomWebSeries  # open_object's type for dicomweb+http(s) URLs
