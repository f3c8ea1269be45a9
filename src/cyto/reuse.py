"""The rule of reuse: earlier work is reused only once it has proved to be what it claims.

Whatever cyto keeps to avoid recomputing (a training checkpoint, a finished or interrupted slide,
a cohort's slide folder, a verification record, a calibration store, a review session, the marks
refine learns from) is written with a *key*: a dict of everything the work was computed from
(data fingerprint, config and method, model and manifest hash, scorer settings, input file
identity, library versions and machine where they matter). Before reuse, :func:`check_reuse`
compares the key recorded with the key of the work asked for now, and checks the artifacts
themselves (:class:`Artifact`: they exist, read back, hold the columns and the rows the record
says). On any mismatch the caller redoes the work or refuses, with :meth:`Reuse.words`: one line
that names what differs by the user's flag names, never by field names, and never shows the value
of a secret setting (a review's seed).

A record's decision (a gate passed) is not part of what is reused: the caller recomputes it from
the record's numbers on every read. The page ``docs/explanation/reuse.md`` states the rule for
new features.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cyto.errors import first_line
from cyto.tables import parquet_file

#: shown instead of the value of a secret key field (what differs is said, never the value)
HIDDEN = "(hidden)"


def key_sha256(key: Mapping[str, Any]) -> str:
    """A stable hash of a key (canonical JSON: sorted keys, no spaces)."""
    text = json.dumps(key, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Artifact:
    """A file that earlier work left and a reuse relies on.

    ``kind``: ``file`` (exists and is not empty), ``json`` (parses), ``parquet``
    (its footer reads back; ``rows``, ``columns`` and the file metadata ``meta``, when given,
    must match: another slide's table of as many rows is not this one), ``folder`` (exists).
    ``size``, when given: the bytes the file must hold (a large file cut short or replaced,
    checked without reading it). ``what`` names it for the user (default: the file name).
    """

    path: Path
    kind: str = "file"
    rows: int | None = None
    columns: tuple[str, ...] = ()
    what: str = ""
    meta: tuple[tuple[str, str], ...] = ()
    size: int | None = None

    def problem(self) -> str | None:
        """What is wrong with the artifact, in words, or None when it holds what it should."""
        path = Path(self.path)
        name = self.what or path.name
        if self.kind == "folder":
            return None if path.is_dir() else f"{name} is missing"
        if not path.is_file():
            return f"{name} is missing"
        try:
            size = path.stat().st_size
        except OSError as exc:
            return f"{name} cannot be read ({exc.strerror or exc})"
        if size == 0:
            return f"{name} is empty"
        if self.size is not None and size != self.size:
            return f"{name} holds {size} bytes where {self.size} were written"
        if self.kind == "json":
            try:
                json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                return f"{name} does not read back as JSON ({first_line(exc)})"
        if self.kind == "parquet":
            import pyarrow as pa

            try:
                parquet = parquet_file(path)  # cyto.tables: a name Arrow takes, or its bytes
                meta, schema = parquet.metadata, parquet.schema_arrow
            except (pa.ArrowException, OSError, ValueError) as exc:
                return f"{name} does not read back as Parquet ({first_line(exc)})"
            names, written = set(schema.names), schema.metadata or {}
            for field_name, value in self.meta:
                got = written.get(field_name.encode(), b"").decode(errors="replace")
                if got != value:
                    return f"{name} was written for another {field_name.split('.')[-1]}"
            missing = [c for c in self.columns if c not in names]
            if missing:
                return f"{name} lacks the column(s) {', '.join(missing)}"
            if self.rows is not None and meta.num_rows != self.rows:
                return f"{name} holds {meta.num_rows} rows where {self.rows} were written"
        return None


@dataclass(frozen=True)
class Reuse:
    """The outcome of :func:`check_reuse`: ``ok`` when the key matches and every artifact holds.

    ``differs``: the settings or inputs that changed, in the user's words (``--top-k 400 -> 100``);
    ``broken``: what is wrong with the artifacts; ``missing``: no record was found at all."""

    differs: tuple[str, ...] = ()
    broken: tuple[str, ...] = ()
    missing: bool = False
    notes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def ok(self) -> bool:
        return not (self.differs or self.broken or self.missing)

    def words(self) -> str:
        """What stands in the way of reuse, in one line ('' when nothing does)."""
        if self.missing:
            return "no record of the earlier work"
        parts = []
        if self.differs:
            parts.append("other settings or inputs: " + "; ".join(self.differs))
        if self.broken:
            parts.append("; ".join(self.broken))
        return "; ".join(parts)


def _show(value: Any) -> str:
    if value is None:
        return "default"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ",".join(_show(v) for v in value) or "none"
    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return value[:12]  # a sha256: its first digits say enough
    return str(value)


def flag_name(key: str, names: Mapping[str, str] | None = None) -> str:
    """The user's name of a key field: ``names[key]`` when given, else the option's own name in
    the caller's words (:func:`cyto.flags.named`: its flag, ``--mpp`` for ``slide_mpp``, at the
    command line; the keyword from Python)."""
    from cyto.flags import named

    if names and key in names:
        return names[key]
    return named(key)


def _group_differences(key: str, name: str, was: Mapping, now: Mapping) -> list[str]:
    """What moved in a group of settings (:data:`cyto.flags.GROUPS`): the members that are flags
    of their own by their flag (``--detection smear -> pap``); the preset's other settings, which
    follow from it, only when it did not move (``--detection smear's sigma 2 -> 8``)."""
    from cyto.flags import GROUPS, named

    own = GROUPS[key]
    out = [
        f"{named(own[k])} {_show(was.get(k))} -> {_show(now.get(k))}"
        for k in own
        if not _same(was.get(k), now.get(k))
    ]
    kind = next(iter(own))
    if _same(was.get(kind), now.get(kind)):
        out += [
            f"{name} {_show(now.get(kind))}'s {d}"
            for d in differences(
                {k: v for k, v in was.items() if k not in own},
                {k: v for k, v in now.items() if k not in own},
                {k: k for k in {*was, *now}},
            )
        ]
    return out


#: the key fields that hold files by their paths, each its content's identity (a slide and its
#: planes: :func:`cyto.infer.store.slide_key`), not settings whose absence is their default
FILES_BY_PATH = ("slide",)


def _keyed_differences(name: str, was: Mapping, now: Mapping) -> list[str]:
    """What moved in a field keyed by the user's own names (the slide's files by path, each its
    content's identity): the same contents read from other files said so, a key on one side
    only as added or gone, not as a setting's "default" (a watch that took up a slide another
    run had scored from another folder said "file content: A default -> b1b7...; B b1b7... ->
    default": hostile round 45, 15)."""
    gone = [k for k in was if k not in now]
    added = [k for k in now if k not in was]
    if gone and added and _same(sorted(map(str, was.values())), sorted(map(str, now.values()))):
        return [f"{name} the same content, read from {', '.join(added)} (was {', '.join(gone)})"]
    out = [
        f"{name} {k} {_show(was[k])} -> {_show(now[k])}"
        for k in now
        if k in was and not _same(was[k], now[k])
    ]
    out += [f"{name} {k} added ({_show(now[k])})" for k in added]
    out += [f"{name} {k} gone (was {_show(was[k])})" for k in gone]
    return out


def differences(
    recorded: Mapping[str, Any],
    current: Mapping[str, Any],
    names: Mapping[str, str] | None = None,
    secret: Iterable[str] = (),
) -> list[str]:
    """The fields of ``current`` and ``recorded`` that differ, as ``NAME then -> now``; a nested
    dict names only its fields that moved, after its own name (``--set lr 0.001 -> 0.01`` for
    ``{"config": {"lr": ...}}`` with ``names={"config": "--set"}``; a group named ``""`` holds
    options with flags of their own: ``--tile 512 -> 1024``), and a ``secret`` field says
    only that it differs. A field one side lacks reads as None (its default): a setting added
    after a record was written does not void it at its default."""
    from cyto.flags import GROUPS

    secret = set(secret)
    out: list[str] = []
    for key in dict.fromkeys([*current, *recorded]):
        was, now = recorded.get(key), current.get(key)
        if _same(was, now):
            continue
        name = flag_name(key, names)
        if key in secret:
            out.append(f"{name} differs")
        elif isinstance(was, Mapping) and isinstance(now, Mapping) and not name:
            out += differences(was, now, names, secret)  # a group of options with own flags
        elif isinstance(was, Mapping) and isinstance(now, Mapping) and key in GROUPS:
            out += _group_differences(key, name, was, now)
        elif isinstance(was, Mapping) and isinstance(now, Mapping) and key in FILES_BY_PATH:
            out += _keyed_differences(name, was, now)
        elif isinstance(was, Mapping) and isinstance(now, Mapping):
            out += [f"{name} {d}" for d in differences(was, now, {k: k for k in {*was, *now}})]
        else:
            out.append(f"{name} {_show(was)} -> {_show(now)}")
    return out


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON would record them (a tuple and the list it was read back as are one)."""
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def check_reuse(
    recorded: Mapping[str, Any] | None,
    current: Mapping[str, Any],
    artifacts: Iterable[Artifact] = (),
    names: Mapping[str, str] | None = None,
    secret: Iterable[str] = (),
) -> Reuse:
    """May earlier work be reused? Its recorded key must equal ``current`` field for field and
    every artifact must hold what the record says (see the module docstring). The one check every
    place that reuses work goes through."""
    if not isinstance(recorded, Mapping):
        return Reuse(missing=True)
    differs = tuple(differences(recorded, current, names, secret))
    broken = tuple(p for a in artifacts if (p := a.problem()) is not None)
    return Reuse(differs=differs, broken=broken)


#: the field of a kept record that holds the sha256 of the rest of it (:func:`sealed_record`)
RECORD_SHA = "record_sha256"


def _record_digest(record: Mapping[str, Any]) -> str:
    rest = {k: v for k, v in record.items() if k != RECORD_SHA}
    return key_sha256(json.loads(json.dumps(rest, sort_keys=True, default=str)))


def sealed_record(record: Mapping[str, Any]) -> dict:
    """``record`` with the sha256 of its own contents (:data:`RECORD_SHA`), as a kept record is
    written: one edited by hand, or damaged so that it still reads as JSON, no longer matches
    (:func:`record_intact`). Not a guard against forgery (a forger computes it again): an fp32
    verification record edited to Spearman 0.5 was read and shown as "passed ... Spearman
    0.5000" (hostile round 70, 4)."""
    body = json.loads(json.dumps(dict(record), sort_keys=True, default=str))
    return {**body, RECORD_SHA: _record_digest(body)}


def record_intact(record: Mapping[str, Any]) -> bool:
    """Whether a kept record is as it was written: its :data:`RECORD_SHA` matches its contents
    (a record of a cyto before the field is taken as it reads)."""
    return RECORD_SHA not in record or record[RECORD_SHA] == _record_digest(record)


#: the kept records said to be damaged, in this process (:func:`say_damaged_record`)
_SAID_DAMAGED: set[str] = set()


def say_damaged_record(path: Path, what: str, then: str) -> None:
    """One line, once per record and process, for a kept record that is there but not as cyto
    wrote it (unreadable, cut short, filed under another's name, its numbers missing) and is
    made again (``then``): it was redone without a word, where a damaged file it vouches for
    was said, so a workstation's keeper was never told its cache was damaged (hostile round
    71, 2). ``what`` names the record: ``the verification record``."""
    from cyto.errors import CytoWarning, warn_caller

    if str(path) in _SAID_DAMAGED:
        return
    _SAID_DAMAGED.add(str(path))
    warn_caller(
        f"{what} {path} is not as cyto wrote it (damaged or edited, or another cyto's): {then}",
        CytoWarning,
    )


def read_record(path: Path) -> dict | None:
    """A JSON object written by earlier work, or None when it is absent or does not read back
    (a record that cannot be read is no record: the work is redone)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None
