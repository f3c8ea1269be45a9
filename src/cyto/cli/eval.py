"""``cyto eval sweep|scores``: top-K metrics over witness-rate sweeps and score tables."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cyto.cli._app import StorageOption, eval_app, seed_option
from cyto.tables import json_text


@eval_app.command("sweep", short_help="The paper's witness-rate sweep: train, rank, tables, plots.")
def eval_sweep_cmd(
    data: Annotated[Path, typer.Option(help="Folder of class sub-folders, or a manifest.")],
    normal: Annotated[str, typer.Option(help="Normal class(es), comma-separated.")],
    out: Annotated[Path, typer.Option(help="Folder for results, tables, plots and models.")],
    abnormal: Annotated[
        str | None, typer.Option(help="Abnormal classes (default: every other class).")
    ] = None,
    methods: Annotated[str, typer.Option(help="Comma-separated methods.")] = (
        "dsvdd,droc,fs-sil,ws-sil,its2clr"
    ),
    wr: Annotated[str, typer.Option(help="Witness rates in percent, comma-separated.")] = (
        "9,5,1,0.5,0.1,0.05"
    ),
    trials: Annotated[int, typer.Option(help="Trials per WR (test-pool resamples).")] = 10,
    k: Annotated[int, typer.Option(help="K of the top-K metrics.")] = 400,
    preset: Annotated[
        str,
        typer.Option(
            help="Training preset for every method; 'paper' for the methods' own recipes "
            "(ResNet18 at 224 px: a GPU's work)."
        ),
    ] = "fast",
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="Override a setting: key=value for every method, METHOD:key=value for one "
            "(e.g. dsvdd:ae_epochs=2).",
        ),
    ] = None,
    seed: Annotated[int, seed_option("Seed of the split, bags and trials.")] = 0,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    train_fraction: Annotated[
        float,
        typer.Option(
            help="Share of the normal cells in the 10 training bags; the rest are held out "
            "(0.7: the paper's 18,369 / 7,873 split)."
        ),
    ] = 0.5,
) -> None:
    """The paper's witness-rate sweep: train, rank held-out cells, tables and log-log plots.

    Interrupt and rerun the same command to continue from the finished (method, WR) cells.
    """
    from cyto.errors import ConfigError
    from cyto.eval.sweep import SweepSpec, run_sweep
    from cyto.flags import comma_list

    try:
        wrs = comma_list(wr, "wrs", float)
    except ValueError as exc:
        raise ConfigError(f"--wr must be numbers separated by commas, got {wr!r}") from exc
    spec = SweepSpec(
        data=data,
        normal=normal,
        abnormal=abnormal,
        methods=comma_list(methods, "methods"),
        wrs=wrs,
        trials=trials,
        k=k,
        preset=preset,
        seed=seed,
        device=device,
        overrides=tuple(set_ or ()),
        train_fraction=train_fraction,
    )
    done = run_sweep(spec, out, echo=typer.echo)
    md, tex = done.tables
    typer.echo(md.read_text())
    typer.echo(f"results {done.results}; tables {md}, {tex}; {len(done.plots)} plots in {out}")


@eval_app.command(
    "scores", short_help="TP@K, Recall@K, Precision@K, nDCG@K, AUTK@K, AUFROC@K, AUROC."
)
def eval_scores_cmd(
    table: Annotated[
        str,
        typer.Argument(
            help="Score table (Parquet or CSV), one row per cell; or a slide's folder of cyto "
            "score (its scores.parquet); a path or a URL (s3://BUCKET/OUT/SLIDE, gs://...).",
            metavar="TABLE",
        ),
    ],
    k: Annotated[
        list[str] | None,
        typer.Option(
            "--k",
            help="K; several comma-separated (--k 100,400) or repeated. Default 400 (the "
            "paper's); a K above the table's cells judges the whole table, said.",
        ),
    ] = None,
    score_column: Annotated[
        str,
        typer.Option(
            help="Column with scores (higher = abnormal; cyto's rank, 1 = most abnormal, is read "
            "as such); auto: what cyto's rank follows (the ranking the table records; a CSV copy, "
            "which loses that record, by the column its rank follows, said)."
        ),
    ] = "auto",
    label_column: Annotated[str, typer.Option(help="Column with 0/1 labels (1 = abnormal).")] = (
        "label"
    ),
    by_class: Annotated[
        bool,
        typer.Option(
            help="Also each abnormal class against the normal classes alone (those whose rows are "
            "all labelled 0, or --normal; on a composed slide NILM and 'unmatched') (a "
            "multi-class table: "
            "the Bethesda classes of Pap cells, cell types): its AUROC and Recall@K."
        ),
    ] = False,
    class_column: Annotated[str, typer.Option(help="Column with class names (--by-class).")] = (
        "class"
    ),
    normal: Annotated[
        str | None,
        typer.Option(
            help="Normal class(es) for --by-class, comma-separated (default: the classes "
            "whose rows are all labelled 0)."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    storage_option: StorageOption = None,
) -> None:
    """TP@K, Recall@K, Precision@K, nDCG@K, AUTK@K, normalized AUFROC@K and AUROC."""
    from cyto.eval.scores import evaluate_scores
    from cyto.flags import comma_list
    from cyto.slides.remote import parse_options

    ks = [kk for text in k for kk in comma_list(text, "k", _k)] if k else [400]

    def note(line: str) -> None:  # beside --json's JSON, never in it
        typer.echo(line, err=as_json)

    # "also": the overall metrics too, where the table has its 0/1 labels
    both = evaluate_scores(
        table, ks, score_column, label_column, by_class, class_column, normal, note,
        parse_options(storage_option),
    )  # fmt: skip
    rows, classes = both["overall"], both["by_class"]
    if as_json:
        done = rows if classes is None else {"overall": rows, "by_class": classes}
        typer.echo(json_text(done, indent=2))
        return
    if rows is None:
        typer.echo(
            f"{table}: no {label_column!r} column, so no overall metrics "
            "(--label-column: the column of 0/1 labels)"
        )
    else:
        _overall(table, rows)
    if classes is not None:
        _by_class(table, classes, ks)


def _k(item: str) -> int:
    """One K of ``--k``: a whole number, refused in one line naming the flag."""
    from cyto.errors import ConfigError

    try:
        return int(item)
    except ValueError:
        raise ConfigError(f"--k takes whole numbers (--k 100,400), got {item!r}") from None


def _overall(table: str, rows: list[dict]) -> None:
    first = rows[0]
    typer.echo(
        f"{table}: {first['n']} cells, {first['positives']} abnormal, AUROC {first['auroc']:.4f} "
        f"(judged by {first['score_column']!r})"
    )
    typer.echo(
        f"{'K':>6} {'TP@K':>6} {'Recall':>8} {'Prec':>8} {'nDCG':>8} {'AUTK':>9} {'AUFROC':>8}"
    )
    for r in rows:
        typer.echo(
            f"{r['k']:>6} {r['tp_at_k']:>6} {r['recall_at_k']:>8.4f} "
            f"{r['precision_at_k']:>8.4f} {r['ndcg_at_k']:>8.4f} {r['autk_at_k']:>9.3f} "
            f"{r['aufroc_at_k']:>8.4f}"
        )


def _by_class(table: str, classes: list[dict], ks: list[int]) -> None:
    """Each class's AUROC and Recall@K, headed by the K asked: a class with fewer cells (with the
    normal ones) than K is judged whole, as the note before says (the header named the smallest
    class's pool, which the other rows were not judged at: hostile round 39, 4)."""
    typer.echo(f"{table}: each abnormal class against {classes[0]['normal'] if classes else '-'}")
    head = "".join(f" {'Recall@' + str(kk):>12}" for kk in ks)
    typer.echo(f"{'class':>16} {'cells':>6} {'AUROC':>7}{head}")
    for c in classes:
        recalls = "".join(f" {r['recall_at_k']:>12.4f}" for r in c["by_k"])
        typer.echo(f"{c['class']:>16} {c['n_class']:>6} {c['auroc']:>7.4f}{recalls}")
