"""The ``cyto`` app, its command groups, and the option types and parsers commands share."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from cyto.errors import ConfigError
from cyto.flags import comma_list
from cyto.version import __version__


def _typer(**kwargs) -> typer.Typer:
    """A command group. Help and usage errors in click's plain form: paragraphs flow to the
    terminal's width and a usage error is one ``Error: ...`` line (Typer's rich panels keep the
    docstrings' source line breaks and wrap options into a narrow column at 80 columns)."""
    return typer.Typer(rich_markup_mode=None, no_args_is_help=True, **kwargs)


class LocalPath:
    """The parser of a path argument that takes a local path only (a model bundle, training
    cells, a table to write; ``typer.Option(parser=LocalPath(...))``): a URL is refused in one
    line naming the flag (:func:`cyto.location.local_path`, the rule the Python API keeps too),
    never turned into a path (``https:/host/...``) and reported missing. ``cli_name``: a
    positional argument's name (``MODEL``)."""

    def __init__(self, field: str, what: str, cli_name: str = "") -> None:
        self.field, self.what, self.cli_name = field, what, cli_name
        self.__name__ = "path"  # the metavar of its values in the help, as a Path's (PATH)

    def __call__(self, value: str | Path) -> Path:
        if isinstance(value, Path):
            return value
        from cyto.location import local_path

        return local_path(self.field, value, self.what, self.cli_name)


#: a model bundle, as cyto info, export, predict, score and calibrate take it
BUNDLE = LocalPath("model", "a model bundle folder: copy it to this machine first", "MODEL")
#: ``--data``: a folder of cells or a manifest on this machine (cyto train, cyto predict)
CELLS_DATA = LocalPath("data", "a folder of cells or a manifest: copy it here first")
CELLS_DATA_HELP = "Folder of class sub-folders, or a manifest."
#: cyto predict's: cells of unknown class to score may come as one folder of images
PredictData = Annotated[
    Path,
    typer.Option(
        parser=CELLS_DATA,
        help="Folder of class sub-folders, a manifest, or (without --normal) a folder of cells "
        "of unknown class.",
    ),
]


app = _typer(
    name="cyto",
    help="Find the few malignant cells among ~10^5 normal ones on a whole-slide cytology image.",
    add_completion=False,
    pretty_exceptions_enable=False,
)
synth_app = _typer(help="Draw synthetic cytology data (the built-in demo data).")
data_app = _typer(help="Inspect cell-patch datasets.")
app.add_typer(synth_app, name="synth")
app.add_typer(data_app, name="data")
eval_app = _typer(help="Evaluate rankings: top-K metrics.")
app.add_typer(eval_app, name="eval")
bench_app = _typer(
    help="Measure throughput: engine backends, scoring kernels, whole-slide scoring.",
    short_help="Measure throughput: engines, kernels, slides, cohorts.",
)
app.add_typer(bench_app, name="bench")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"cyto {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """cyto: one-class models rank every cell of a slide by how abnormal it looks."""
    asks_help = any(a in ctx.help_option_names for a in sys.argv[1:])
    if ctx.invoked_subcommand != "doctor" and not asks_help:  # doctor shows the cache's state
        from cyto.location import refuse_unusable_cache

        refuse_unusable_cache()


# cyto score and cyto predict: the one switch that scores without the check on golden cells
SkipVerify = Annotated[
    bool,
    typer.Option(
        "--skip-verify",
        help="Score without first running the graph on the bundle's golden cells here and "
        "comparing with their reference scores (recorded).",
    ),
]


def _ints(text: str, what: str) -> list[int]:
    try:
        values = list(comma_list(text, what, int, name=what))
    except ValueError as exc:
        raise ConfigError(f"{what} expects comma-separated integers, got {text!r}") from exc
    if min(values) < 1:
        raise ConfigError(f"{what} expects positive integers, got {text!r}")
    return values


ResultsOpt = Annotated[
    Path,
    typer.Option(
        help="Folder for the result files (<kind>_<host>_<date>.json and .md; a later run that "
        "day adds -2, -3: nothing is written over)."
    ),
]


def _csv(text: str | None, what: str) -> tuple[str, ...] | None:
    """The items of the comma list ``text`` of the flag ``what`` (:func:`cyto.flags.comma_list`:
    an empty item or one given twice is refused); None: not given."""
    if text is None:
        return None
    return comma_list(text, what, name=what)


def used_words(n_used: int | None, n_images: int | None) -> str:
    if n_used is None or n_used == n_images:
        return f"{n_images} images"
    return f"{n_used} normal images (of {n_images})"


class _ReviewGroup(TyperGroup):
    """``cyto review SCORED_DIR...`` is short for ``cyto review serve SCORED_DIR...``."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["serve", *args]
        return super().parse_args(ctx, args)


review_app = _typer(
    cls=_ReviewGroup,
    help="Blinded expert review of the top-K cells in the browser, and its report. "
    "'cyto review SCORED_DIR... --reviewer NAME' is short for 'cyto review serve ...'.",
    short_help="Blinded expert review of the top-K cells, and its report.",
)
app.add_typer(review_app, name="review")


def _checked_seed(value: int | None) -> int | None:
    from cyto.flags import check_seed

    return None if value is None else check_seed(value)


def ranged_option(help: str, bounds: Any, **kwargs: Any) -> Any:
    """A numeric option held to ``bounds`` (a :class:`cyto.flags.Range`) as it is parsed: a
    value outside is one line naming the flag, before any work (``cyto bench scorer --dims -1``
    ended in numpy's raw ValueError, ``--repeats -1`` timed nothing and wrote a table)."""

    def checked(ctx: typer.Context, param: Any, value: Any) -> Any:
        from cyto.errors import ConfigError
        from cyto.flags import said

        if value is not None and not bounds.holds(value):
            raise ConfigError(f"{said(param.name)} must be {bounds.words()}, got {value!r}")
        return value

    checked.bounds = bounds  # type: ignore[attr-defined]  (tests walk the options by it)
    return typer.Option(help=help, callback=checked, **kwargs)


def seed_option(help: str, **kwargs: Any) -> Any:
    """A ``--seed`` option, held to the one rule for a seed (:func:`cyto.flags.check_seed`) as
    it is parsed: a negative seed is one line naming ``--seed``, before any work is done."""
    return typer.Option(help=help, callback=_checked_seed, **kwargs)


#: fsspec storage options of URL slides (``--storage-option KEY=VALUE``, repeatable)
StorageOption = Annotated[
    list[str] | None,
    typer.Option(
        help="KEY=VALUE for the file system of URL slides (fsspec's storage options), e.g. "
        "endpoint_url=http://127.0.0.1:9000 for an S3-compatible server; repeatable. "
        "Credentials come from the standard chains (environment, profile).",
    ),
]
Download = Annotated[
    bool,
    typer.Option(
        help="URL slides in a format read from a local file (OpenSlide's vendors, DICOM "
        "files), and any slide of a server that serves no byte ranges, are fetched to cyto's "
        "cache first; other TIFFs are read in place.",
    ),
]

#: ``--backend`` of every command that scores cells (cyto score, predict, bench slide): one text,
#: which named OpenVINO nowhere in score's and predict's help, though auto chose it on a CPU
#: (hostile round 44, 2)
BACKEND = typer.Option(
    help="auto (the fastest engine that passes verification here: on a GPU a TensorRT engine "
    "for it or ONNX Runtime; on a CPU ONNX Runtime or OpenVINO; PyTorch where no exported graph "
    "serves), onnx, onnx-trt (ONNX Runtime's TensorRT provider), openvino (CPU), trt or torch "
    "(the trained network)."
)

RankBy = Annotated[
    str,
    typer.Option(
        help="What orders the cells: model (its score), morphometry (how far the cell's "
        "morphometry lies from the training normals'), model+morphometry (the mean of each "
        "cell's two ranks), or auto: what ranked the cells held back at training best (cyto "
        "train with abnormal classes beside the normal ones), else the model."
    ),
]


#: a URL as a ``Path`` argument leaves it (``s3://b/x`` -> ``s3:/b/x``)
_MANGLED_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:/")


#: the parameters that name what a command writes (``--out``/``OUT``, review serve's
#: ``--session``, bench's ``--results`` and ``--work``): the folder above each is checked before
#: any work (bench ran for minutes, then ended in a traceback: hostile round 45, 2)
OUTPUTS = ("out", "session", "results", "work")


def local_paths_only(callback):
    """``callback`` (a command) refusing a URL given for any of its ``Path`` parameters: a
    ``Path`` argument is a local one (those that take URLs are typed ``str``); a URL there was
    turned into ``./s3:/b/x`` and written to, or reported missing as ``s3:/b/x`` (hostile round
    6). One line naming the flag (:func:`cyto.location.local_path`'s words). Each is read
    through :func:`cyto.envvars.user_path` (``~`` the home folder), and the folder above an
    ``out`` must be a folder this user can write to (:func:`cyto.outputs_check.check_writable`):
    an ``--out`` under a file ended train, synth slide and data mosaic in a traceback (hostile
    round 43, 3)."""
    import functools
    import typing

    hints = typing.get_type_hints(callback, include_extras=True)

    def label(name: str) -> str:
        from cyto.flags import said

        meta = getattr(hints.get(name), "__metadata__", ())
        if any(type(m).__name__ == "ArgumentInfo" for m in meta):
            return name.upper()
        return said(name)

    @functools.wraps(callback)
    def run(*args, **kwargs):
        from cyto.envvars import user_path
        from cyto.errors import InputPathError
        from cyto.slides.remote import redact

        for name, value in kwargs.items():
            for v in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(v, Path) and _MANGLED_URL.match(str(v)):
                    url = re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*):/", r"\1://", str(v))
                    raise InputPathError(
                        f"{label(name)} takes a local path, not a URL: {redact(url)} (copy it "
                        "to this machine first, or write here and copy it there after)"
                    )
            # ~ is the home folder, as a shell expands it (--out=~/x reaches cyto unexpanded)
            if isinstance(value, Path):
                kwargs[name] = user_path(value)
            elif isinstance(value, (list, tuple)) and any(isinstance(v, Path) for v in value):
                kwargs[name] = type(value)(
                    user_path(v) if isinstance(v, Path) else v for v in value
                )
        for name in OUTPUTS:  # the folder above an output takes it, before any work
            if isinstance(kwargs.get(name), Path):
                from cyto.outputs_check import check_output

                check_output(kwargs[name], flag=f"{label(name)} {kwargs[name]}:")
        from cyto.cachedir import places_of
        from cyto.errors import PLACES

        # where a full disk that names no file is looked for (the CLI's last word says it,
        # after this command returned: set for the command, not reset)
        PLACES.set(places_of(kwargs.values()))
        return callback(*args, **kwargs)

    return run


def guard_local_paths(typer_app: typer.Typer) -> None:
    """:func:`local_paths_only` over every command of ``typer_app`` and its groups."""
    for info in typer_app.registered_commands:
        if info.callback is not None and not getattr(info.callback, "_local_paths", False):
            info.callback = local_paths_only(info.callback)
            info.callback._local_paths = True
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            guard_local_paths(group.typer_instance)
