"""Derived engines: what cyto compiles from a sealed graph and keeps, and what vouches for them.

An OpenVINO compiled model and a TensorRT plan are built from one of the bundle's ONNX graphs
and kept outside the seal (cyto's user cache, ``BUNDLE/engines/``), so building or deleting
one never changes the bundle. What runs is the engine, not the graph; so one rule covers
every such file:

1. An engine is kept with a record written after it: the key it was built for, its file, its
   sha256 and its size (:class:`KeptEngine` here; TensorRT's ``engines/index.json``).
2. It is read once, as bytes, and those bytes are checked against the record before the
   runtime gets them (:func:`read_engine`); the runtime is handed the bytes, never the path.
   An engine that is missing, cut short, grown, changed or replaced is not loaded: it is
   compiled anew where the runtime can (OpenVINO), or refused where only ``cyto export`` can
   build it (TensorRT), with one line that says why.
3. The sha256 and size of the bytes handed to the runtime are part of the key of the
   verification record (:func:`cyto.runtime.verify.artifact`, :meth:`EngineFile.as_key`): a
   record made on other bytes does not vouch for these, and they are verified on the golden
   cells again, never shown as "passed (cached for this machine)".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cyto.tables import json_text

RECORD_FORMAT = "cyto-derived-engine"
RECORD_VERSION = 1


@dataclass(frozen=True)
class EngineFile:
    """The bytes of a derived engine as they were handed to the runtime."""

    path: Path
    sha256: str
    size: int

    @classmethod
    def of(cls, path: Path, data: bytes) -> EngineFile:
        return cls(Path(path), hashlib.sha256(data).hexdigest(), len(data))

    def as_key(self) -> dict[str, Any]:
        """What the verification key holds of the engine: its name, sha256 and size."""
        return {"engine": self.path.name, "engine_sha256": self.sha256, "engine_size": self.size}


def read_engine(path: Path, sha256: str, size: int | None = None) -> tuple[bytes | None, str]:
    """The bytes of the engine ``path`` when they are the ``sha256`` (and ``size``) its record
    holds; else None and why, in words (missing, cut short, grown, changed)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None, f"{path.name} is missing"
    except OSError as exc:
        return None, f"{path.name} cannot be read ({exc.strerror or exc})"
    if size is not None and len(data) != size:
        how = "cut short" if len(data) < size else "grown"
        return None, f"{path.name} is {how} ({len(data)} bytes, its record says {size})"
    if hashlib.sha256(data).hexdigest() != sha256:
        return None, f"{path.name} does not match its sha256 (changed, damaged or replaced)"
    return data, ""


class KeptEngine:
    """One derived engine kept in ``folder`` for ``key``: the file ``STEM-<sha256[:16]>SUFFIX``
    and its record ``STEM.json``, written last (see the module docstring). A file is never
    rewritten under its name: a new engine gets a new file, then the record names it, so a
    reader sees either the old pair or the new one."""

    def __init__(
        self,
        folder: Path,
        stem: str,
        suffix: str,
        key: dict[str, Any],
    ) -> None:
        self.folder = Path(folder)
        self.stem = stem
        self.suffix = suffix
        self.key = json.loads(json.dumps(key))  # as it reads back from the record
        self.record_path = self.folder / f"{stem}.json"

    def load(self) -> tuple[bytes | None, EngineFile | None, str]:
        """(bytes, their EngineFile, "") for the kept engine of this key; (None, None, why)
        when there is none to trust ("" when none was ever kept here)."""
        from cyto.reuse import check_reuse, read_record

        if not self.record_path.exists():
            return None, None, ""
        record = read_record(self.record_path)
        if (
            record is None
            or record.get("format") != RECORD_FORMAT
            or not isinstance(record.get("file"), str)
            or not isinstance(record.get("sha256"), str)
            or not isinstance(record.get("size"), int)
            or Path(record["file"]).name != record["file"]
        ):
            return None, None, f"its record {self.record_path.name} does not read back"
        # the key's fields by their own names: no flag chose them
        reuse = check_reuse(record.get("key"), self.key, names={k: k for k in self.key})
        if not reuse.ok:
            # the folder is this key's own: a record naming another was changed or damaged,
            # never a choice of the user's ("built for --precision fp32 -> bf16", which nobody
            # passed: hostile round 13, #5)
            return (
                None,
                None,
                (
                    f"its record {self.record_path.name} does not match the folder it is kept in "
                    f"(changed or damaged: {'; '.join(reuse.differs)})"
                ),
            )
        path = self.folder / record["file"]
        data, why = read_engine(path, record["sha256"], record["size"])
        if data is None:
            return None, None, why
        return data, EngineFile.of(path, data), ""

    def keep(self, data: bytes) -> EngineFile:
        """Write ``data`` and then its record; the engine it replaces is removed. Returns the
        engine as kept (raises OSError where the folder cannot be written)."""
        from cyto.bundle import atomic_write
        from cyto.locks import file_lock

        sha = hashlib.sha256(data).hexdigest()
        engine = EngineFile(self.folder / f"{self.stem}-{sha[:16]}{self.suffix}", sha, len(data))
        path = engine.path
        self.folder.mkdir(parents=True, exist_ok=True)
        with file_lock(self.folder / ".lock"):
            atomic_write(path, data)
            record = {
                "format": RECORD_FORMAT,
                "version": RECORD_VERSION,
                "key": self.key,
                "file": path.name,
                "sha256": engine.sha256,
                "size": engine.size,
            }
            atomic_write(self.record_path, json_text(record, indent=1, sort_keys=True).encode())
            for old in self.folder.glob(f"{self.stem}-*{self.suffix}"):
                if old != path:
                    with contextlib.suppress(OSError):
                        old.unlink()
        return engine
