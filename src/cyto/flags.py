"""Option fields, their types and their flags: one schema for the CLI and the Python API.

An option has one name in the library and the Python API, its *field* (``top_k``), and one at
the command line, its *flag* (``--top-k``). :data:`FLAGS` writes down every flag that is not the
field spelled with dashes (``slide_mpp`` is ``--mpp``), and the fields no command takes as a
flag. :func:`said` names a field in the words of whoever called: the flag from the command line,
``top_k=`` from Python (each call of :mod:`cyto.api` runs inside :func:`python_words`), so one
message serves both callers. A message that names an option goes through :func:`said` (or
:func:`passing`: ``--overwrite`` at the CLI, ``overwrite=True`` from Python).

The types are the annotations of the dataclass or the function that takes the options
(``ScoreOptions.top_k: int``); :func:`check_value` holds a value to its annotation and
:func:`bind_call` binds a public call's arguments: an unknown keyword, a missing or extra
argument and a value of the wrong type are refused with one :class:`~cyto.errors.ConfigError`
line in the caller's words, never as Python's ``TypeError`` from deep inside. A numeric
argument's range is part of its annotation (``threads: Annotated[int | None, Range(0, 1024)]``),
held by the same check; the score options' ranges are checked where the options are
(``ScoreOptions.__post_init__``), named through :func:`said`.
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import functools
import inspect
import math
import numbers
import os
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

from cyto.errors import ConfigError

#: the flag of each field whose flag is not ``--field-with-dashes`` (None: no command takes it
#: as a flag; it is named by its field everywhere)
FLAGS: dict[str, str | None] = {
    "slide_mpp": "--mpp",
    "precisions": "--precision",  # cyto export's
    "fmt": "--format",  # cyto synth slide's container
    "storage_options": "--storage-option",  # fsspec's options of remote slides and outputs
    "review": "--marks",  # cyto refine's: the review folder whose marks it learns from
    "overrides": "--set",  # cyto train's and refine's config overrides
    "wrs": "--wr",  # cyto eval sweep's witness rates
    "config_file": "--config",  # cyto train's
    "fdr_alpha": "--fdr",
    "verify": "--skip-verify",
    "queue": None,
    "chunk_cells": None,
    "max_cells": None,
    "truth_radius": None,
    "echo": None,
    "chunk": None,  # cyto.predict's images per chunk
    "calib_limit": None,  # cyto.export's cells to calibrate int8 on, at most
    "extra_manifest": None,
    "mixed_sizes": None,  # refine's slide crops beside training patches (one field of view)
    "objective": None,  # the synthetic slide's recorded magnification (SlideSynthConfig's)
}
#: options recorded as a group of settings (a dataclass), of which some are flags of their own:
#: ``--detection KIND`` sets the detection preset, ``--detector`` its implementation; the rest
#: are the preset's settings, which no flag sets
GROUPS: dict[str, dict[str, str]] = {"detection": {"kind": "detection", "detector": "detector"}}
#: boolean fields whose flag says the opposite (``--skip-verify`` is ``verify=False``)
NEGATED = frozenset({"verify"})

_PYTHON: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "cyto_python_call", default=None
)


@contextlib.contextmanager
def python_words(call: str) -> Iterator[None]:
    """Messages raised inside name options as a Python caller wrote them (``top_k=``);
    ``call``: the public call (``score_slide``)."""
    token = _PYTHON.set(call)
    try:
        yield
    finally:
        _PYTHON.reset(token)


def python_call() -> str | None:
    """The public Python call being served (None: the command line, or library code)."""
    return _PYTHON.get()


def export_words(
    path, precision: str | None = None, cells: str | None = None, onnx: bool = True, **given: str
) -> str:
    """The export that makes a bundle's graph, in the caller's words: ``cyto export PATH
    --precision fp16 --parity-cells CELLS`` at the command line, ``cyto.export('PATH',
    precisions='fp16', parity_cells=CELLS)`` from Python (a Python caller was told the command
    line's: hostile round 56, 3). ``precision``: None for the plain export (fp32 and the golden
    cells); ``cells``: the option the cells go to (``calib``, ``parity_cells``, ``cells``);
    ``onnx=False``: the fp32 graph is not exported again; ``given``: more options with their
    values (``calib_class="normal"``)."""
    from cyto.errors import as_arg

    if python_call():
        more = "" if onnx else ", onnx=False"
        more += f", precisions={precision!r}" if precision else ""
        more += f", {cells}=CELLS" if cells else ""
        more += "".join(f", {k}={v!r}" for k, v in given.items())
        return f"cyto.export({str(path)!r}{more})"
    more = "" if onnx else " --no-onnx"
    more += f" --precision {precision}" if precision else ""
    more += f" {flag(cells)} CELLS" if cells else ""
    more += "".join(f" {flag(k)} {as_arg(v)}" for k, v in given.items())
    return f"cyto export {as_arg(path)}{more}"


def flag(field: str) -> str:
    """The command-line flag of ``field`` (its field name where no command takes it)."""
    if field in FLAGS:
        return FLAGS[field] or field
    return f"--{field.replace('_', '-')}"


def named(field: str) -> str:
    """``field`` as the caller names it in a list of what changed: ``--top-k`` at the command
    line, ``top_k`` from Python."""
    return field if python_call() else flag(field)


def said(field: str) -> str:
    """``field`` in the caller's words: ``--top-k`` at the command line, ``top_k=`` from
    Python."""
    return f"{field}=" if python_call() else flag(field)


def check_choice(field: str, value: Any, choices: Sequence[str]) -> Any:
    """``value`` when it is one of ``choices``; otherwise one :class:`ConfigError` line naming
    ``field`` in the caller's words: the one rule of every named choice (a backend, a precision,
    a ranking). ``load_model(backend="onnxx")`` said "unknown backend" and
    ``precision must be ...`` where ``score_slide`` said ``backend= must be one of ...``
    (hostile round 70, 1)."""
    if value not in choices:
        raise ConfigError(f"{said(field)} must be one of {', '.join(choices)}, got {value!r}")
    return value


def ran(field: str) -> str:
    """A setting ``auto`` resolves (the precision), named in a list of what changed as what ran,
    never as a flag the caller may not have passed: "the precision run (auto's choice, or
    --precision)". A resume that started over after the backend auto took changed blamed
    "--precision fp32 -> bf16" on a user who passed no --precision (hostile round 35, 3)."""
    return f"the {field} run (auto's choice, or {said(field).rstrip('=')})"


class Placeholder(str):
    """A value's placeholder in advice (``UM_PER_PX``): written bare in both callers' words
    (``--mpp UM_PER_PX``, ``slide_mpp=UM_PER_PX``), never quoted as if it were a string."""

    def __repr__(self) -> str:
        return str(self)


#: the placeholders of numbers in advice
UM_PER_PX, FACTOR = Placeholder("UM_PER_PX"), Placeholder("FACTOR")


def passing(field: str, value: Any = True) -> str:
    """How the caller passes ``field`` with ``value``: ``--overwrite`` / ``overwrite=True``,
    ``--top-k 100`` / ``top_k=100``, ``--skip-verify`` / ``verify=False``, ``--no-hard-normals``
    / ``hard_normals=False``."""
    if python_call():
        return f"{field}={str(value)!r}" if isinstance(value, Path) else f"{field}={value!r}"
    if isinstance(value, bool):
        if value is False and field not in NEGATED and flag(field).startswith("--"):
            return f"--no-{flag(field)[2:]}"  # a --x/--no-x switch turned off
        return flag(field)
    return f"{flag(field)} {value}"


def to_pass(given: Any, *wanted: tuple[str, Any]) -> str | None:
    """Advice to pass ``wanted`` (``(field, value)`` pairs, in the order said) in the caller's
    words, leaving out each field ``given`` already holds (not None, not False): ``given`` is
    the options as passed (a mapping or an object of fields). Advice to pass what was passed
    misleads (``--mpp 0.25 --rescale`` was told "pass its true --mpp with --rescale" when the
    model's mpp was what lacked). ``'--mpp UM_PER_PX and --rescale'``; None: all were given."""

    def held(field: str) -> bool:
        value = given.get(field) if isinstance(given, Mapping) else getattr(given, field, None)
        return value is not None and value is not False

    todo = [passing(f, v) for f, v in wanted if not held(f)]
    return " and ".join(todo) or None


def setting(key: str, value: Any = None) -> str:
    """A training config setting in the caller's words: ``--set eps`` (``--set eps=0.1``) at the
    command line, ``eps (in overrides=)`` (``overrides={'eps': 0.1}``) from Python; ``value``:
    the text shown for it (None: the setting alone)."""
    if python_call():
        return f"{key} (in overrides=)" if value is None else f"overrides={{'{key}': {value}}}"
    return f"{flag('overrides')} {key}" + ("" if value is None else f"={value}")


@dataclass(frozen=True)
class Range:
    """The range of a numeric argument, written in its annotation
    (``Annotated[int | None, Range(0, 1024, "0 or None: the backend's default")]``) and held by
    :func:`check_value` after its type: ``lo`` and ``hi`` included (None: no bound; ``open_lo``:
    ``lo`` excluded); ``note`` says the unit or what a special value means, in the refusal."""

    lo: float | None = None
    hi: float | None = None
    note: str = ""
    open_lo: bool = False

    def holds(self, value: Any) -> bool:
        if value is None or not isinstance(value, numbers.Real) or isinstance(value, bool):
            return True  # None (where the type allows it) is the default, not a number
        above = self.lo is None or (value > self.lo if self.open_lo else value >= self.lo)
        return above and (self.hi is None or value <= self.hi)

    def words(self) -> str:
        lo, hi = _number(self.lo), _number(self.hi)
        if self.lo is not None and self.hi is not None and not self.open_lo:
            said_range = f"between {lo} and {hi}"
        elif self.lo is not None:
            said_range = f"{'>' if self.open_lo else '>='} {lo}"
            said_range += f" and <= {hi}" if self.hi is not None else ""
        else:
            said_range = f"<= {hi}"
        return said_range + (f" ({self.note})" if self.note else "")


def _number(bound: float | None) -> str:
    """A bound as a person reads it: a whole number in full (4294967295, not 4.29497e+09)."""
    if bound is None:
        return ""
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"


#: the range of a random seed: what numpy's generators take
SEED_RANGE = Range(0, 2**32 - 1, "a random seed")
#: the annotation of a seed argument (``seed: Seed = 0``)
Seed = typing.Annotated[int, SEED_RANGE]


#: the annotation of a size or scale that must be above 0 (``--scale``, ``--mpp``)
Positive = typing.Annotated[float, Range(0, open_lo=True)]


#: the range of every pixel size (um per pixel) a user gives cyto: a microscope's, whose cells
#: show a nucleus (a 10 um nucleus is 1 px at 10); ``--set mpp=25.8`` for 0.258 trained a
#: model whose morphometric score fell to chance without a word (hostile round 25, 20), and
#: each entry had a rule of its own (> 0; 0.01 to 100)
MPP_RANGE = Range(0.01, 10, "um per pixel: about 0.25 at a 40x objective, 0.5 at 20x")
#: the annotation of a pixel size (``--mpp``, ``--model-mpp``, ``--patch-mpp``, ``mpp=``)
Mpp = typing.Annotated[float, MPP_RANGE]


def check_mpp(field: str, value: Any) -> Any:
    """A pixel size held to :data:`MPP_RANGE` (None passes: unknown), refused in one
    :class:`ConfigError` line naming ``field`` in the caller's words: the one rule of every
    mpp a user gives (``cyto score``, ``cyto predict``, ``cyto train``, ``cyto synth``)."""
    return value if value is None else check_value(field, value, Mpp)


#: the annotation of a share of cells (``--abnormal-fraction``: the witness rate)
Share = typing.Annotated[float, Range(0, 1, "a share of the cells")]
#: the annotation of a synthetic slide's side in px (at least one 512 px block)
SlideSide = typing.Annotated[int, Range(512, None, "px")]

#: the annotation of a JPEG quality argument (what PIL and pyvips take)
JpegQuality = typing.Annotated[int, Range(1, 100, "JPEG quality")]


def check_seed(value: Any, field: str = "seed", name: str | None = None) -> int:
    """A random seed held to :data:`Seed` (an integer 0 .. 2**32 - 1, as numpy takes it), the
    one rule for every seed that enters cyto (each ``--seed``, ``seed=``, the training setting):
    refused in one :class:`ConfigError` line naming ``field`` in the caller's words (``--seed``,
    ``seed=``), or as ``name`` says (a training setting: :func:`setting`)."""
    got = _coerce(value, int)
    if got is _WRONG or not SEED_RANGE.holds(got):
        what = name or said(field)
        raise ConfigError(f"{what} must be an integer {SEED_RANGE.words()}, got {_show(value)}")
    return got


@dataclass(frozen=True)
class Local:
    """A path argument that names a local file or folder only (a model bundle, training cells,
    a table to write), written in its annotation (``Annotated[str | Path, Local("...")]``):
    a URL given for it is refused in one line (:func:`cyto.location.local_path`: the Python
    API's front door and the CLI alike), never turned into a path and reported missing;
    ``what``: what it names and what to do instead."""

    what: str


def local_of(hint: Any) -> Local | None:
    """The :class:`Local` mark of an annotation, or None."""
    if typing.get_origin(hint) is typing.Annotated:
        return next((m for m in typing.get_args(hint)[1:] if isinstance(m, Local)), None)
    return None


def _unannotated(hint: Any) -> tuple[Any, list[Range]]:
    """``hint`` without its ``Annotated`` wrapper, and the ranges written in it."""
    if typing.get_origin(hint) is typing.Annotated:
        base, *meta = typing.get_args(hint)
        return base, [m for m in meta if isinstance(m, Range)]
    return hint, []


def _kind_words(hint: Any) -> str:
    hint = _unannotated(hint)[0]
    if hint is bool:
        return "True or False"
    if hint is int:
        return "an integer"
    if hint is float:
        return "a finite number"
    if hint is str:
        return "a string"
    if hint is Path:
        return "a path (str or Path)"
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        parts = [a for a in typing.get_args(hint) if a is not type(None)]
        if Path in parts and str in parts:  # a path's words say str
            parts.remove(str)
        words = " or ".join(dict.fromkeys(_kind_words(a) for a in parts))
        # None is a Python caller's to give; at the command line it is the option left out
        # ("--fdr must be a finite number or None": hostile round 69, 8)
        return words + (" or None" if type(None) in typing.get_args(hint) and python_call() else "")
    if origin in (tuple, list, Sequence) or hint in (tuple, list):
        return "a list"
    if origin is dict or hint is dict:  # overrides=, storage_options=: --set, --storage-option
        return "a dict ({'key': value}, where the command line takes key=value)"
    if isinstance(origin, type):
        return f"a {origin.__name__.lower()}"
    return f"a {getattr(hint, '__name__', str(hint))}"


_WRONG = object()


def _coerce(value: Any, hint: Any) -> Any:
    """``value`` as ``hint`` takes it (a str for a Path becomes a Path), or :data:`_WRONG`."""
    hint = _unannotated(hint)[0]
    if hint is Any:
        return value
    if hint is type(None):
        return None if value is None else _WRONG
    if hint is bool:
        return value if isinstance(value, bool) else _WRONG
    if hint is int:
        ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
        return int(value) if ok else _WRONG
    if hint is float:
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
        return float(value) if ok and math.isfinite(value) else _WRONG
    if hint is str:
        return value if isinstance(value, str) else _WRONG
    if hint is Path:
        ok = isinstance(value, (str, os.PathLike)) and str(os.fspath(value)).strip()
        return Path(value) if ok else _WRONG
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        for arm in typing.get_args(hint):  # in order: ``str | Path`` keeps a str a str
            got = _coerce(value, arm)
            if got is not _WRONG:
                return got
        return _WRONG
    if origin in (tuple, list, Sequence):
        if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)):
            return _WRONG
        args = [a for a in typing.get_args(hint) if a is not Ellipsis]
        arm = args[0] if args else Any
        items = [_coerce(v, arm) for v in value]
        return _WRONG if any(v is _WRONG for v in items) else type(value)(items)
    if isinstance(origin, type):  # dict[str, Any], Callable[[str], None], ...
        return value if isinstance(value, origin) else _WRONG
    if isinstance(hint, type):
        return value if isinstance(value, hint) else _WRONG
    return value  # a hint this schema does not read (a TypeVar, a Literal): the callee checks


def check_value(field: str, value: Any, hint: Any) -> Any:
    """``value`` held to the annotation ``hint`` of ``field``; returns it as the field takes it
    (a str given for a Path, as a Path). Raises :class:`ConfigError` in the caller's words:
    ``top_k= must be an integer, got 'ten'`` (``--top-k`` at the command line). A float must be
    finite, and a number within the :class:`Range` its annotation writes
    (``threads= must be between 0 and 1024 (...), got -1``)."""
    got = _coerce(value, hint)
    if got is _WRONG:
        item = _item_hint(hint) if isinstance(value, (list, tuple)) else None
        wrong = [v for v in value if _coerce(v, item) is _WRONG] if item is not None else []
        if wrong:  # a list where a list is taken: the item that is wrong is named
            raise ConfigError(
                f"each item of {said(field)} must be {_kind_words(item)}, got {_show(wrong[0])}"
            )
        # several values where the call takes one (score_slide([a, b], ...)): one per call;
        # not where it takes a dict (overrides=["epochs=1"]: "a dict ... (one per call)")
        takes = _unannotated(hint)[0]
        many = typing.get_origin(takes) in (typing.Union, types.UnionType) and any(
            typing.get_origin(a) is dict or a is dict for a in typing.get_args(takes)
        )
        many = many or typing.get_origin(takes) is dict or takes is dict
        one = " (one per call)" if isinstance(value, (list, tuple)) and not many else ""
        raise ConfigError(f"{said(field)} must be {_kind_words(hint)}{one}, got {_show(value)}")
    for bounds in _unannotated(hint)[1]:
        if not bounds.holds(got):
            raise ConfigError(f"{said(field)} must be {bounds.words()}, got {_show(value)}")
    return got


def _item_hint(hint: Any) -> Any:
    """The annotation of a list's items where ``hint`` takes a list (``str | Sequence[str]``:
    ``str``), else None."""
    hint = _unannotated(hint)[0]
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        arms = [_item_hint(a) for a in typing.get_args(hint)]
        return next((a for a in arms if a is not None), None)
    if origin in (tuple, list, Sequence) or hint in (tuple, list):
        args = [a for a in typing.get_args(hint) if a is not Ellipsis]
        return args[0] if args else Any
    return None


#: values a refusal shows as written (repr); any other object is named by its type
_PLAIN = (str, bytes, int, float, bool, type(None), list, tuple, dict, set, frozenset, PurePath)


def _show(value: Any) -> str:
    """A given value as a one-line refusal shows it: as written, up to 60 characters, or, an
    object, by its type (``a pyarrow.Table``: its repr, the table's schema and rows over several
    lines, was printed whole: hostile round 43, 7)."""
    if isinstance(value, _PLAIN):
        text = repr(value).replace("\r", "\\r").replace("\n", "\\n")
    else:
        kind = type(value)
        package = kind.__module__.split(".")[0]
        text = (
            f"a {kind.__qualname__}"
            if package == "builtins"
            else f"a {package}.{kind.__qualname__}"
        )
    return text if len(text) <= 60 else f"{text[:57]}..."


def hints_of(target: Any, localns: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The annotations of a dataclass's fields or a function's parameters, evaluated (those
    that do not evaluate, e.g. names imported only for type checkers, read as ``Any``)."""
    target = target if isinstance(target, type) else inspect.unwrap(target)
    module = inspect.getmodule(target)
    scope = dict(vars(module)) if module else {}
    out: dict[str, Any] = {}
    annotations = target.__annotations__
    for name, text in annotations.items():
        if name == "return":
            continue
        try:
            out[name] = eval(text, scope, dict(localns or {})) if isinstance(text, str) else text
        except Exception:  # noqa: BLE001 - an annotation for type checkers only
            out[name] = Any
    return out


#: keywords no public call takes because that work is the command line's alone: what to use
#: instead, said in place of a nearest spelling (``ray=`` was offered ``rank_by=``)
ELSEWHERE: dict[str, str] = {
    # a shell command, quoted: no flag offered as if it were a keyword
    "ray": "score_slide scores one slide on this machine; a cohort on a Ray cluster is scored "
    "from the command line: `cyto score SLIDE... --out OUT --ray ADDRESS`",
}
ELSEWHERE["ray_part_tiles"] = ELSEWHERE["ray"]
#: how close a spelling must be to a known keyword to be offered as what was meant
#: (difflib's ratio: ``topk``/``top_k`` 0.89; ``ray``/``rank_by`` 0.6 is no typo)
NEAR = 0.75


def unknown_words(call: str, unknown: list[str], known: list[str]) -> str:
    """``call`` refuses keyword(s) it does not take, with the nearest it does (only one that
    is really close, :data:`NEAR`), or where that work is done (:data:`ELSEWHERE`)."""
    names = ", ".join(said(k) for k in unknown)
    elsewhere = list(dict.fromkeys(ELSEWHERE[k] for k in unknown if k in ELSEWHERE))
    if elsewhere:
        return f"{call}: unknown option(s) {names}: {'; '.join(elsewhere)}"
    # a flag's own name (fdr= for --fdr) is the field it sets; else the nearest spelling
    by_flag = {
        f.lstrip("-").replace("-", "_"): field for field, f in FLAGS.items() if f and field in known
    }
    near = [
        m
        for k in unknown
        for m in (
            [by_flag[k]] if k in by_flag else difflib.get_close_matches(k, known, n=1, cutoff=NEAR)
        )
    ]
    hint = f" (did you mean {', '.join(said(m) for m in near)}?)" if near else ""
    return f"{call}: unknown option(s) {names}{hint}; known: {', '.join(known)}"


def check_options(call: str, given: Mapping[str, Any], target: Any) -> dict[str, Any]:
    """``given`` keyword options of ``call`` held to the fields of ``target`` (a dataclass, a
    function, or their annotations as a dict): unknown names and wrong types refused in the
    caller's words. Returns them as the fields take them."""
    hints = dict(target) if isinstance(target, Mapping) else hints_of(target)
    known = list(hints)
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ConfigError(unknown_words(call, unknown, known))
    return {k: check_value(k, v, hints[k]) for k, v in given.items()}


@functools.cache
def _schema(func: Callable) -> tuple[inspect.Signature, dict[str, Any]]:
    """The signature and annotations of a call bound often (a scorer's ``score``), read once."""
    return inspect.signature(func), hints_of(func)


def bind_call(
    func: Callable, args: tuple, kwargs: dict, localns: Mapping[str, Any] | None = None
) -> inspect.BoundArguments:
    """The arguments of a public call bound to its signature, each held to its annotation; a
    wrong count, an unknown keyword or a wrong type is one :class:`ConfigError` line. A
    ``**options`` catch-all is bound as given: the callee checks it (:func:`check_options`)."""
    if localns is None:
        sig, hints = _schema(func)
    else:
        sig, hints = inspect.signature(func), hints_of(func, localns)
    name = func.__name__
    params = sig.parameters
    named = [p for p in params.values() if p.kind is not p.VAR_KEYWORD]
    takes_more = any(p.kind is p.VAR_KEYWORD for p in params.values())
    unknown = [k for k in kwargs if k not in params or params[k].kind is params[k].VAR_KEYWORD]
    if unknown and not takes_more:
        raise ConfigError(unknown_words(name, sorted(unknown), [p.name for p in named]))
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError:
        positional = [p.name for p in named if p.kind is p.POSITIONAL_OR_KEYWORD]
        if len(args) > len(positional):
            raise ConfigError(
                f"{name} takes {len(positional)} argument(s) by position "
                f"({', '.join(positional)}), got {len(args)}; give the others by name"
            ) from None
        given = set(kwargs) | set(positional[: len(args)])
        missing = [p.name for p in named if p.default is p.empty and p.name not in given] or [
            k for k in kwargs if k in positional[: len(args)]
        ]
        raise ConfigError(
            f"{name} needs {', '.join(f'{m}=' for m in missing)} (given once each)"
        ) from None
    for key, value in list(bound.arguments.items()):
        if params[key].kind is params[key].VAR_KEYWORD or key not in hints:
            continue
        if value is params[key].default:
            continue  # a default is what the call chose
        bound.arguments[key] = check_value(key, value, hints[key])
    return bound


def comma_list(
    text: str,
    field: str,
    convert: Callable[[str], Any] = str,
    *,
    fold: bool = False,
    name: str | None = None,
) -> tuple[Any, ...]:
    """The items of a comma-separated option (``--methods dsvdd,ocsvm``, ``--wr 1,2``), the one
    parser of every comma list: each item stripped, and ``convert``-ed (a ``ValueError`` is
    left to the caller, who knows what the items are); ``fold``: items compared without case.
    Refused in one :class:`ConfigError` line naming ``field`` in the caller's words: a list
    that names nothing (``''``), an empty item (``'1,,2'``: a typo, never dropped silently)
    and an item given twice (``dsvdd,dsvdd`` would train it twice, or record what it did not
    do)."""
    what = name or said(field)
    if not str(text).strip():
        raise ConfigError(f"{what} names nothing, got {_show(text)}: give one or more items")
    out: list[Any] = []
    for raw in str(text).split(","):
        item = raw.strip()
        if not item:
            raise ConfigError(f"{what} has an empty item in {_show(text)}")
        value = convert(item.lower() if fold else item)
        if value in out:
            raise ConfigError(f"{what} lists {item} twice")
        out.append(value)
    return tuple(out)
