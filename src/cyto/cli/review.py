"""``cyto review serve|report`` and ``cyto refine``: blinded expert review and learning from it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from cyto.cli._app import StorageOption, _csv, app, review_app, seed_option
from cyto.errors import as_arg


@review_app.command(
    "serve", short_help="Serve the review page: each slide's top-K cells as a grid."
)
def review_serve_cmd(
    scored: Annotated[
        list[str],
        typer.Argument(
            help="Output folders of cyto score (a slide's folder or a cohort's, as paths or "
            "URLs: s3://BUCKET/OUT/SLIDE, with --session), or a review folder made before."
        ),
    ],
    reviewer: Annotated[
        str, typer.Option(help="Your name or initials; marks are kept per reviewer.")
    ],
    session: Annotated[
        Path | None,
        typer.Option(
            help="The review folder (cases, crops, key, marks). Default: SCORED_DIR/review "
            "(with several folders: review/ in their common parent)."
        ),
    ] = None,
    k: Annotated[
        int | None,
        typer.Option(
            "--k",
            help="Top cells of each model shown per slide. Default: 100 (a review opened "
            "again: the k it was built with).",
            show_default=False,
        ),
    ] = None,
    seed: Annotated[
        int | None,
        seed_option(
            "Seed of the case ids and cell order. Default: a secret one, kept in the "
            "review's key only (a known seed would tell each grid position's rank)."
        ),
    ] = None,
    merge_um: Annotated[
        float | None,
        typer.Option(
            help="Cells of several models closer than this (um) are shown once. Default: 4.0 "
            "(a review opened again: the distance it was built with).",
            show_default=False,
        ),
    ] = None,
    host: Annotated[
        str, typer.Option(help="Address to listen on; the default keeps it on this computer.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0: any free one).")] = 8765,
    storage_option: StorageOption = None,
) -> None:
    """Serve the review page: each slide's top-K cells, shuffled, as a 10x10 grid to mark.

    Slides appear in a random order under anonymized case ids; several models' top-K of the same
    slide are pooled and deduplicated, so nobody can tell which model surfaced a cell. Every mark
    is written at once to REVIEW/marks.sqlite; stop and restart at any time. Each reviewer runs
    their own page (another --reviewer and --port) and sees only their own marks.
    """
    from cyto.errors import ConfigError
    from cyto.location import scored_folders
    from cyto.review.server import check_reviewer, serve
    from cyto.review.session import KEY_FILE, build_session, open_session
    from cyto.slides.remote import is_url, parse_options, redact

    reviewer = check_reviewer(reviewer)
    urls = [g for g in scored if is_url(g)]
    if urls and session is None:  # its marks would go to cyto's cache, and be lost with it
        raise ConfigError(
            f"{redact(urls[0])} is a URL: give --session DIR, a local folder where the review "
            "and its marks are kept"
        )
    options = parse_options(storage_option)
    scored = scored_folders(scored, options)
    if session is None and len(scored) == 1 and (scored[0] / KEY_FILE).is_file():
        opened = open_session(scored[0])
    else:
        if session is None:
            common = Path(os.path.commonpath([p.resolve() for p in scored]))
            session = common / "review"
        opened = build_session(
            scored, session, k=k, seed=seed, merge_um=merge_um, echo=typer.echo, options=options
        )
    serve(opened, reviewer, host=host, port=port, echo=typer.echo)


@review_app.command("report", short_help="Unblind the marks: expert table, Cohen's kappa, figures.")
def review_report_cmd(
    review: Annotated[Path, typer.Argument(help="The review folder (cases, key and marks).")],
    out: Annotated[
        Path | None, typer.Option(help="Where to write the report. Default: REVIEW/report.")
    ] = None,
    reviewers: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated reviewers, in the table's order. Default: all, by name."
        ),
    ] = None,
    include_unfinished: Annotated[
        bool,
        typer.Option(
            "--include-unfinished",
            help="Count cases a reviewer has not marked done in their kappa, precision and "
            "recall (their unmarked cells taken as normal), and show their truth (unblinding "
            "them). Default: left out, and named.",
        ),
    ] = False,
    overwrite: Annotated[
        bool, typer.Option(help="Replace what an --out folder holds (REVIEW/report is rebuilt).")
    ] = False,
) -> None:
    """Unblind the marks: the expert table, Cohen's kappa and the review figures.

    Writes REVIEW/report/: expert_table.csv and .md (marks per slide and model, per reviewer,
    both and either), report.json (with kappa and, where the slides were scored with ground
    truth, the precision and recall of the marks) and figures/CASE.png (one stroke per reviewer
    on each cell they marked). REVIEW/report is the session's own, rebuilt as the marks come
    in; another --out that holds files is replaced only with --overwrite.
    """
    from cyto.outputs_check import refuse_to_replace
    from cyto.review.report import write_report

    if out is not None and Path(out).absolute() != (Path(review) / "report").absolute():
        refuse_to_replace(out, overwrite)

    rep = write_report(
        review, out, list(_csv(reviewers, "--reviewers")) if reviewers else None, include_unfinished
    )
    for who, cases in rep["unfinished"].items():
        if cases and not include_unfinished:
            typer.echo(
                f"note: {who} has not finished {len(cases)} case(s) ({', '.join(cases)}): left "
                "out of their kappa, precision and recall (--include-unfinished counts them)"
            )
    if rep["withheld_note"]:
        typer.echo(f"note: {rep['withheld_note']}")
    for t in rep["totals"]:
        typer.echo(
            f"{t['model']}: {t['cells_shown']} cells shown over {t['slide']}, marks "
            f"{t['marks']}, both {t['both']}, either {t['either']}"
        )
    for kp in rep["kappa"]:
        v = "undefined" if kp["kappa"] is None else f"{kp['kappa']:.3f}"
        typer.echo(f"Cohen's kappa {kp['reviewers'][0]} vs {kp['reviewers'][1]}: {v}")
    if rep["truth"] and rep["truth"]["overall"]:
        for who, pr in rep["truth"]["overall"].items():
            p = "n/a" if pr["precision"] is None else f"{pr['precision']:.2f}"
            r = "n/a" if pr["recall_of_shown"] is None else f"{pr['recall_of_shown']:.2f}"
            typer.echo(
                f"marks of {who}: {pr['true_abnormal_marked']}/{pr['marked']} truly abnormal "
                f"(precision {p}), recall of abnormal cells shown {r}"
            )
    typer.echo(f"-> {rep['files']['expert_table_md']}, {len(rep['figures'])} figure(s)")


@app.command("refine", short_help="Retrain a model with the marks of an expert review.")
def refine_cmd(
    model: Annotated[Path, typer.Argument(help="The bundle whose top cells were reviewed.")],
    marks: Annotated[Path, typer.Option(help="The review folder (cyto review).")],
    data: Annotated[Path, typer.Option(help="The model's training data (folder or manifest).")],
    out: Annotated[Path, typer.Option(help="The new bundle to write, e.g. dsvdd-r1.cyto.")],
    normal: Annotated[
        str | None, typer.Option(help="Normal class(es) of DATA. Default: the bundle's.")
    ] = None,
    abnormal: Annotated[
        str | None, typer.Option(help="Abnormal classes of DATA (default: every other class).")
    ] = None,
    agree: Annotated[
        str,
        typer.Option(help="A cell is known abnormal when marked by any (or all) reviewers."),
    ] = "any",
    eta: Annotated[
        float, typer.Option(help="Deep SVDD: Deep SAD weight of the known abnormal cells.")
    ] = 1.0,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="Override one setting of the bundle's config: key=value."),
    ] = None,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    overwrite: Annotated[bool, typer.Option(help="Replace an existing bundle.")] = False,
    finetune: Annotated[
        bool | None,
        typer.Option(
            "--finetune/--retrain",
            help="--finetune (Deep SVDD's default): continue from the model's encoders and "
            "centres at a tenth of its learning rate; --retrain (the default of the other "
            "methods): train anew.",
            show_default=False,
        ),
    ] = None,
    hard_normals: Annotated[
        bool,
        typer.Option(
            help="Add the reviewed cells nobody marked to the normal training cells "
            "(--no-hard-normals: learn from the marked cells only)."
        ),
    ] = True,
) -> None:
    """Retrain a model with the expert marks: reviewed cells nobody marked become hard normals,
    marked cells known abnormal ones (Deep SVDD learns them as Deep SAD, FS-SIL as labels).

    Only cases marked done count. A Deep SVDD model is fine-tuned, other methods are trained
    anew. The new bundle records what it learned from (refined_from).
    """
    from cyto.review.refine import refine

    res = refine(
        model,
        marks,
        data,
        out,
        normal=normal,
        abnormal=abnormal,
        agree=agree,
        eta=eta,
        overrides=set_,
        device=device,
        overwrite=overwrite,
        echo=typer.echo,
        finetune=finetune,
        hard_normals=hard_normals,
    )
    typer.echo(
        f"wrote {res['bundle']} in {res['seconds']:.0f} s: +{res['hard_normals']} hard normal, "
        f"+{res['known_abnormal']} known abnormal cell(s); export it before cyto score "
        f"(cyto export {as_arg(res['bundle'])})"
    )
