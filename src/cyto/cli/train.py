"""``cyto train``: one of the paper's five methods into a model bundle."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from cyto.cli._app import CELLS_DATA, CELLS_DATA_HELP, LocalPath, app, used_words

METHOD_NAMES = ("fs-sil", "ws-sil", "dsvdd", "droc", "its2clr")
#: what the help says of --data, --out and --normal, which --print-config reads none of
REQUIRED = "Required unless --print-config."


def _required(help: str, **kwargs) -> typer.models.OptionInfo:
    """An option ``cyto train`` needs but for ``--print-config`` (checked in the command)."""
    return typer.Option(help=f"{REQUIRED} {help}", show_default=False, **kwargs)


@app.command("train")
def train_cmd(
    ctx: typer.Context,
    method: Annotated[str, typer.Argument(help=f"One of: {', '.join(METHOD_NAMES)}.")],
    # --data, --out and --normal are required but by --print-config, which reads none of them
    # (it asked for a bundle path it never writes: hostile round 66, 3)
    data: Annotated[Path | None, _required(CELLS_DATA_HELP, parser=CELLS_DATA)] = None,
    out: Annotated[
        Path | None,
        _required(
            "Bundle folder to write, e.g. dsvdd.cyto.",
            parser=LocalPath("out", "the bundle to write: cyto train writes a local folder"),
        ),
    ] = None,
    normal: Annotated[str | None, _required("Normal class(es), comma-separated.")] = None,
    abnormal: Annotated[
        str | None, typer.Option(help="Abnormal classes (default: every other class).")
    ] = None,
    preset: Annotated[
        str | None, typer.Option(help="Named preset, e.g. 'fast' (CPU, minutes).")
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            parser=LocalPath("config_file", "a config file: copy it here first"),
            help="TOML or YAML (.yaml, .yml) file with the same keys as the config.",
        ),
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="Override one setting: key=value, repeatable (--print-config lists them; a "
            "quick trial: --set epochs=2 --set ae_epochs=1 --set n_seeds=1, since Deep SVDD's "
            "autoencoder start and its seeds take time of their own). From Python: "
            "overrides={'epochs': 2}.",
        ),
    ] = None,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    weights: Annotated[
        Path | None,
        typer.Option(
            parser=LocalPath("weights", "a weights file: copy it here first"),
            help="Local backbone weights (state dict) to start from.",
        ),
    ] = None,
    resume: Annotated[bool, typer.Option(help="Continue an interrupted run.")] = False,
    skip_unreadable: Annotated[
        bool, typer.Option(help="Skip (and count) unreadable images instead of failing.")
    ] = False,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing bundle.")] = False,
    print_config: Annotated[
        bool, typer.Option(help="Print the resolved config as TOML and exit.")
    ] = False,
) -> None:
    """Train one of the paper's five methods and write a model bundle."""
    from cyto.train.config import resolve_config, to_toml
    from cyto.train.registry import get_method

    if print_config:
        cfg = resolve_config(get_method(method).Config, preset, config, set_, method=method)
        typer.echo(to_toml(cfg), nl=False)
        return
    from cyto.train.api import refuse_resume_and_overwrite, train

    refuse_resume_and_overwrite(resume, overwrite)  # before anything else, as it was
    # said as click says a required option left out (Typer may carry a click of its own)
    missing = sys.modules[typer.BadParameter.__module__].MissingParameter
    for flag, value in (("--data", data), ("--out", out), ("--normal", normal)):
        if value is None:
            raise missing(ctx=ctx, param_hint=f"'{flag}'", param_type="option")

    res = train(
        method,
        data,
        out,
        normal=normal,
        abnormal=abnormal,
        preset=preset,
        config_file=config,
        overrides=set_,
        device=device,
        resume=resume,
        weights=weights,
        skip_unreadable=skip_unreadable,
        overwrite=overwrite,
        echo=typer.echo,
    )
    last = {k: round(v[-1], 4) for k, v in res.history.items() if v}
    typer.echo(
        f"trained {res.method} on {used_words(res.n_used, res.n_images)} in {res.seconds:.1f} s; "
        f"final losses {last}; wrote {res.bundle}"
    )
    if res.config.mpp is None:
        typer.echo(
            "note: no training resolution given, so cyto score cannot check a slide's scale "
            "against this model nor resample its crops (--rescale): train with --set "
            "mpp=UM_PER_PX, the patches' microns per pixel (or pass --model-mpp to cyto score)"
        )
    check = res.bag_check
    if check is not None:
        loud = check["status"] != "ok"
        typer.secho(
            ("warning: " if loud else "") + check["message"],
            err=loud,
            fg=typer.colors.RED if check["status"] == "failed" else None,
            bold=loud,
        )
