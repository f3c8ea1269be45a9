"""TensorRT engines of a bundle: derived artifacts, kept apart from the sealed bundle files.

An engine only runs on the GPU model, compute capability and TensorRT version it was built with,
and only computes what the ONNX graph it was built from computes. So every engine is keyed by
all of these, with its precision (the graph's: fp32, fp16 or int8 Q/DQ), its batch profile and
its input size::

    BUNDLE.cyto/engines/index.json        the keys, the plan checksums, build facts, parity
    BUNDLE.cyto/engines/<name>.plan       serialized engines
    BUNDLE.cyto/engines/timing-<gpu>-<sm>-trt<version>.cache   one timing cache per GPU+TensorRT

``engines/`` is outside the manifest's seal: building, rebuilding or deleting an engine never
changes a sealed file, so the bundle always stays loadable. An engine whose key does not match
what is asked for, or whose plan does not match the sha256 and size its entry holds (a derived
engine, :mod:`cyto.runtime.derived`), is never loaded, and the lookup says why. Writers take a
lock on the folder and replace files by atomic rename, so two builds at once cannot leave a
half-written plan or index.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from cyto.bundle import PRECISIONS, atomic_write, read_checked, sha256_file
from cyto.errors import BundleError, ConfigError
from cyto.flags import said
from cyto.locks import file_lock
from cyto.runtime.derived import read_engine
from cyto.tables import json_text

ENGINES_DIR = "engines"
INDEX = "index.json"
INDEX_FORMAT = "cyto-engines"
INDEX_VERSION = 1


@dataclass(frozen=True)
class BatchProfile:
    """The optimization profile of the batch dimension."""

    min: int
    opt: int
    max: int

    def __post_init__(self) -> None:
        if not 1 <= self.min <= self.opt <= self.max:
            raise ConfigError(
                f"batch profile must satisfy 1 <= min <= opt <= max, got "
                f"{self.min},{self.opt},{self.max}"
            )

    @classmethod
    def parse(cls, text: str) -> BatchProfile:
        try:
            parts = [int(p) for p in str(text).split(",")]
        except ValueError as exc:
            raise ConfigError(
                f"{said('batch')} expects min,opt,max (e.g. 1,64,256), got {text!r}"
            ) from exc
        if len(parts) != 3:
            raise ConfigError(f"{said('batch')} expects three numbers min,opt,max, got {text!r}")
        return cls(*parts)

    def as_list(self) -> list[int]:
        return [self.min, self.opt, self.max]


def plan_batches(n: int, batch: int, lo: int, hi: int) -> list[tuple[int, int, int]]:
    """Split ``n`` cells into engine calls ``(start, stop, run_size)``.

    Each call takes at most ``min(batch, hi)`` cells; a call below the profile's minimum ``lo``
    runs padded to ``lo`` rows (the padding rows are dropped afterwards), so every shape set on
    the engine lies inside its profile.
    """
    if n < 0 or batch < 1 or not 1 <= lo <= hi:
        raise ConfigError(f"cannot plan batches of {batch} for a profile {lo}..{hi}")
    step = min(batch, hi)
    return [(i, min(i + step, n), max(min(i + step, n) - i, lo)) for i in range(0, n, step)]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


@dataclass(frozen=True)
class EngineKey:
    """Everything an engine depends on; two engines with equal keys are interchangeable."""

    onnx_sha256: str
    gpu: str
    capability: tuple[int, int]
    tensorrt: str
    precision: str
    profile: BatchProfile
    input_hw: tuple[int, int]

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ConfigError(
                f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}"
            )

    def file_name(self) -> str:
        p, (h, w) = self.profile, self.input_hw
        return (
            f"engine-{_slug(self.gpu)}-sm{self.capability[0]}{self.capability[1]}-"
            f"trt{self.tensorrt}-{self.precision}-b{p.min}-{p.opt}-{p.max}-{h}x{w}-"
            f"{self.onnx_sha256[:12]}.plan"
        )

    def to_json(self) -> dict:
        d = asdict(self)
        d["capability"] = f"{self.capability[0]}.{self.capability[1]}"
        d["profile"] = self.profile.as_list()
        d["input_hw"] = list(self.input_hw)
        return d

    @classmethod
    def from_json(cls, d: dict) -> EngineKey:
        major, minor = (int(v) for v in str(d["capability"]).split("."))
        return cls(
            onnx_sha256=str(d["onnx_sha256"]),
            gpu=str(d["gpu"]),
            capability=(major, minor),
            tensorrt=str(d["tensorrt"]),
            precision=str(d["precision"]),
            profile=BatchProfile(*(int(v) for v in d["profile"])),
            input_hw=(int(d["input_hw"][0]), int(d["input_hw"][1])),
        )


@dataclass(frozen=True)
class EngineWant:
    """What a run needs: the fields an engine must match (profile and size are chosen after)."""

    onnx_sha256: str
    gpu: str
    capability: tuple[int, int]
    tensorrt: str
    precision: str
    input_hw: tuple[int, int] | None = None

    def mismatches(self, key: EngineKey) -> list[str]:
        out = []
        if key.onnx_sha256 != self.onnx_sha256:
            out.append(
                f"built from another ONNX graph (sha256 {key.onnx_sha256[:12]}..., the "
                f"bundle's is {self.onnx_sha256[:12]}...)"
            )
        if key.gpu != self.gpu:
            out.append(f"built for a {key.gpu}, this is a {self.gpu}")
        if key.capability != self.capability:
            out.append(
                f"built for compute capability {key.capability[0]}.{key.capability[1]}, this "
                f"GPU has {self.capability[0]}.{self.capability[1]}"
            )
        if key.tensorrt != self.tensorrt:
            out.append(f"built with TensorRT {key.tensorrt}, this is TensorRT {self.tensorrt}")
        if key.precision != self.precision:
            out.append(f"{key.precision}, not the {self.precision} asked for")
        if self.input_hw is not None and key.input_hw != self.input_hw:
            out.append(
                f"built for {key.input_hw[0]}x{key.input_hw[1]} inputs, not "
                f"{self.input_hw[0]}x{self.input_hw[1]}"
            )
        return out


@dataclass(frozen=True)
class EngineEntry:
    """One engine of the index: its key, its plan file and checksum, what was measured."""

    key: EngineKey
    file: str
    plan_sha256: str
    info: dict

    def to_json(self) -> dict:
        return {
            "key": self.key.to_json(),
            "file": self.file,
            "plan_sha256": self.plan_sha256,
            **self.info,
        }

    @classmethod
    def from_json(cls, d: dict) -> EngineEntry:
        info = {k: v for k, v in d.items() if k not in ("key", "file", "plan_sha256")}
        return cls(EngineKey.from_json(d["key"]), str(d["file"]), str(d["plan_sha256"]), info)


class EngineIndex:
    """The engines of one bundle folder (see the module docstring)."""

    def __init__(self, bundle_path: Path) -> None:
        self.bundle = Path(bundle_path)
        self.dir = self.bundle / ENGINES_DIR

    # --- reading --------------------------------------------------------------------------------
    def entries(self) -> list[EngineEntry]:
        path = self.dir / INDEX
        if not path.is_file():
            return []
        try:
            data = json.loads(path.read_text())
            if data.get("format") != INDEX_FORMAT:
                raise ValueError(f"format {data.get('format')!r}")
            if int(data.get("version", 0)) > INDEX_VERSION:
                raise BundleError(
                    f"{path} was written by a newer cyto (engine index version "
                    f"{data['version']}); upgrade cyto or delete {self.dir}"
                )
            return [EngineEntry.from_json(e) for e in data.get("engines", [])]
        except (ValueError, KeyError, TypeError) as exc:
            raise BundleError(
                f"{path} is not a readable engine index ({exc}); delete {self.dir} and rebuild "
                "the engines (the bundle itself is unaffected)"
            ) from exc

    def find(
        self, want: EngineWant, batch: int | None = None
    ) -> tuple[EngineEntry | None, list[str]]:
        """The engine that matches ``want`` (the one whose profile best fits ``batch``), or
        None and the reason each engine was passed over."""
        fits, reasons = [], []
        for e in self.entries():
            why = want.mismatches(e.key)
            if not why:  # the plan as its entry recorded it (cyto.runtime.derived)
                size = e.info.get("plan_size")
                data, damage = read_engine(self.dir / e.file, e.plan_sha256, size)
                if data is None:
                    why = [f"its plan {damage}"]
            if why:
                reasons.append(f"{e.file}: {'; '.join(why)}")
            else:
                fits.append(e)
        if not fits:
            return None, reasons
        target = batch or 0
        # prefer a profile whose max holds the batch, then the smallest such; else the largest
        fits.sort(key=lambda e: (e.key.profile.max < target, e.key.profile.max))
        return fits[0], reasons

    def plan_path(self, entry: EngineEntry) -> Path:
        return self.dir / entry.file

    def plan_bytes(self, entry: EngineEntry) -> bytes:
        """The plan's bytes, checked against the sha256 its index entry had when it was chosen:
        a plan rebuilt since by another run is refused, never deserialized under the cached
        verification of the plan it replaced."""
        return read_checked(
            self.plan_path(entry),
            entry.plan_sha256,
            "changed after it was chosen (another run rebuilt the engine?): run again to take "
            "the engine as it is now",
        )

    def timing_cache_path(self, gpu: str, capability: tuple[int, int], tensorrt: str) -> Path:
        """One timing cache per GPU model, compute capability and TensorRT version."""
        return (
            self.dir / f"timing-{_slug(gpu)}-sm{capability[0]}{capability[1]}-trt{tensorrt}.cache"
        )

    # --- writing --------------------------------------------------------------------------------
    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """An exclusive lock on the engines folder (one writer at a time)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with file_lock(self.dir / ".lock"):
            yield

    def add(self, key: EngineKey, plan_bytes: bytes, info: dict | None = None) -> EngineEntry:
        """Store a plan under ``key`` (replacing an engine of the same key) and index it."""
        with self.locked():
            name = key.file_name()
            atomic_write(self.dir / name, plan_bytes)
            entry = EngineEntry(
                key,
                name,
                sha256_file(self.dir / name),
                {
                    "built": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    **(info or {}),
                    "plan_size": len(plan_bytes),
                },
            )
            kept = [e for e in self.entries() if e.key != key and e.file != name]
            self._write_index([*kept, entry])
        return entry

    def update_info(self, key: EngineKey, info: dict) -> EngineEntry:
        """Add facts (e.g. a parity report) to an indexed engine."""
        with self.locked():
            entries = self.entries()
            for i, e in enumerate(entries):
                if e.key == key:
                    entries[i] = EngineEntry(e.key, e.file, e.plan_sha256, {**e.info, **info})
                    self._write_index(entries)
                    return entries[i]
        raise BundleError(f"{self.dir}: no engine with key {key.file_name()} to update")

    def remove(self, key: EngineKey) -> bool:
        with self.locked():
            entries = self.entries()
            gone = [e for e in entries if e.key == key]
            if not gone:
                return False
            self._write_index([e for e in entries if e.key != key])
            for e in gone:
                (self.dir / e.file).unlink(missing_ok=True)
            return True

    def _write_index(self, entries: list[EngineEntry]) -> None:
        data = {
            "format": INDEX_FORMAT,
            "version": INDEX_VERSION,
            "engines": [e.to_json() for e in entries],
        }
        atomic_write(self.dir / INDEX, json_text(data, indent=1).encode())
