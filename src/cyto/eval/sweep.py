"""``cyto eval sweep``: the paper's witness-rate sweep over methods, resumable cell by cell.

A cell is (method, WR). Methods whose training data do not depend on the WR (the one-class
methods train on the strictly normal bags) are trained once and reused for every WR, as the paper
does. Every trained model is kept as a bundle under ``OUT/models``; every finished cell adds its
rows to ``OUT/results.csv`` at once (a whole cell or none). Rerunning the same command skips
finished cells and reloads bundles; a second sweep into a folder in use is refused.
"""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Annotated

import numpy as np

from cyto.bundle import atomic_write
from cyto.data.dataset import PatchDataset
from cyto.errors import ConfigError
from cyto.eval.metrics import all_metrics
from cyto.eval.protocol import PAPER_COUNTS, PAPER_WRS, WRProtocol
from cyto.flags import Range, check_seed, check_value, passing, said
from cyto.locks import OutputLock
from cyto.progress import progress
from cyto.reuse import check_reuse
from cyto.tables import json_text

METRIC_COLUMNS = (
    "tp_at_k",
    "recall_at_k",
    "precision_at_k",
    "ndcg_at_k",
    "autk_at_k",
    "aufroc_at_k",
    "auroc",
)
FIELDS = (
    "method",
    "wr",
    "trial",
    "train_abnormal",
    "test_abnormal",
    "effective_wr",
    "n_test",
    "k",
    "metric",
    "value",
)


@dataclass(frozen=True)
class SweepSpec:
    data: Path
    normal: str
    abnormal: str | None
    methods: tuple[str, ...]
    wrs: tuple[float, ...] = PAPER_WRS
    trials: int = 10
    k: int = 400
    preset: str | None = "fast"
    seed: int = 0
    device: str = "auto"
    overrides: tuple[str, ...] = ()
    train_fraction: float = 0.5  # of the normal cells, into the 10 training bags

    def __post_init__(self) -> None:
        for name in ("methods", "wrs"):  # each refused by its own flag, with the value
            items = getattr(self, name)
            if not items:
                raise ConfigError(f"{said(name)} names nothing: give one or more, comma-separated")
            twice = next((v for i, v in enumerate(items) if v in items[:i]), None)
            if twice is not None:
                shown = f"{twice:g}" if isinstance(twice, float) else twice
                raise ConfigError(f"{said(name)} lists {shown} twice")
        for name in ("trials", "k"):
            check_value(name, getattr(self, name), Annotated[int, Range(1)])
        if not 0 < self.train_fraction < 1:
            raise ConfigError(f"train fraction must be in (0, 1), got {self.train_fraction}")
        check_seed(self.seed)
        bad = [w for w in self.wrs if not 0 < w < 100]  # (NaN too) before anything is written
        if bad:
            raise ConfigError(
                f"{said('wrs')} takes witness rates in percent, each in (0, 100), got "
                + ", ".join(f"{w:g}" for w in bad)
            )


def method_overrides(
    overrides: tuple[str, ...], method: str, methods: tuple[str, ...]
) -> list[str]:
    """The ``--set`` items for ``method``: plain ``key=value`` items go to every method,
    ``METHOD:key=value`` items to that method only (e.g. ``dsvdd:ae_epochs=2``)."""
    mine = []
    for item in overrides:
        head = item.split("=", 1)[0]
        if ":" not in head:
            mine.append(item)
            continue
        target, rest = item.split(":", 1)
        if target not in methods:
            raise ConfigError(
                f"--set {item!r} names method {target!r}, which this sweep does not run "
                f"({', '.join(methods)})"
            )
        if target == method:
            mine.append(rest)
    return mine


def method_configs(spec: SweepSpec) -> dict:
    """Each method's resolved config: the preset (``paper``: the method's own recipe), then the
    ``--set`` items for it."""
    from cyto.train.config import ONE_CLASS_ONLY, resolve_config
    from cyto.train.registry import get_method

    preset = None if spec.preset in (None, "paper") else spec.preset
    # nothing is held back in a sweep (it took holdout, recorded it in its bundles and did
    # nothing with it: hostile round 40, 3)
    for item in spec.overrides:
        key = item.split("=", 1)[0].split(":")[-1].strip()
        if key in ONE_CLASS_ONLY:
            raise ConfigError(
                f"--set {item!r}: {key!r} holds normal cells back at training (cyto train "
                "dsvdd or droc with abnormal classes); the sweep holds none back for any method "
                f"({', '.join(spec.methods)}), so it would do nothing here: leave it out"
            )
    return {
        m: resolve_config(
            get_method(m).Config,
            preset,
            overrides=method_overrides(spec.overrides, m, spec.methods),
            method=m,
        )
        for m in spec.methods
    }


SEAL_FORMAT = "cyto-sweep-seal/1"


def _seal_file(results: Path) -> Path:
    return results.with_name("results.seal.json")


def _cell_key(row: list[str]) -> str | None:
    """``method@wr`` of a results row (None: a row without a method or a number for its WR)."""
    try:
        return f"{row[0]}@{float(row[1]):g}"
    except (IndexError, ValueError):
        return None


def _cell_digests(rows: list[list[str]]) -> dict[str, str]:
    """sha256 of each cell's rows (``method@wr``) as the csv module writes them: what
    ``results.seal.json`` records when the cell's rows are written and compares on every rerun."""
    import hashlib

    lines: dict[str, list[str]] = {}
    for row in rows:
        buf = io.StringIO()
        csv.writer(buf).writerow(row)
        lines.setdefault(str(_cell_key(row)), []).append(buf.getvalue())
    return {k: hashlib.sha256("".join(v).encode()).hexdigest() for k, v in lines.items()}


def _read_rows(results: Path) -> list[list[str]]:
    with open(results, newline="") as f:
        rows = list(csv.reader(f))
    if not rows or tuple(rows[0]) != FIELDS:
        raise ConfigError(
            f"{results} is not a sweep's results table (its header is not cyto's): delete it "
            f"and rerun, or use another {said('out')}"
        )
    return rows[1:]


def _finished(results: Path, echo, counts: dict | None = None) -> set[tuple[str, float]]:
    """The cells of ``results.csv`` whose rows are as this sweep wrote them (their digests in
    ``results.seal.json``) and were drawn with this sweep's abnormal cells per WR (``counts``,
    {wr: WRCounts}): those are kept. Rows that differ (edited by hand, added, a cell whose seal a
    stopped run did not write, another count rule's: hostile round 40, 5) are dropped from the
    table, said in one line, and their cells computed again: a rerun never takes a hand-edited
    row for a result."""
    if not results.exists():
        return set()
    rows = _read_rows(results)
    try:
        record = json.loads(_seal_file(results).read_text())
        sealed = dict(record["cells"]) if record.get("format") == SEAL_FORMAT else {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        sealed = {}
    digests = _cell_digests(rows)
    good = {k for k, d in digests.items() if k != "None" and sealed.get(k) == d}
    bad = sorted(set(digests) - good)
    if bad:
        named = [
            b.replace("@", " WR ") if b != "None" else "rows without a method or WR" for b in bad
        ]
        echo(
            f"{results.name}: the rows of {', '.join(named[:4])}{' ...' if len(bad) > 4 else ''} "
            "are not as this sweep wrote them (edited, or not sealed): computed again"
        )
    other = sorted(
        {_cell_key(r) for r in rows if _cell_key(r) in good and _other_counts(r, counts)}
    )
    if other:
        echo(
            f"{results.name}: the rows of {', '.join(o.replace('@', ' WR ') for o in other[:4])}"
            f"{' ...' if len(other) > 4 else ''} were drawn with other abnormal cells than this "
            "sweep's for their WR: computed again"
        )
        good -= set(other)
        bad = [*bad, *other]
    if bad:
        _write_rows(results, [r for r in rows if _cell_key(r) in good])
        _write_seal(results, {k: sealed[k] for k in good})
    return {(k.rsplit("@", 1)[0], float(k.rsplit("@", 1)[1])) for k in good}


def _other_counts(values: list[str], counts: dict | None) -> bool:
    """Was a results row (``values``) drawn with other abnormal cells than ``counts`` gives its
    WR?"""
    row = dict(zip(FIELDS, values, strict=False))
    try:
        c = (counts or {}).get(float(row["wr"]))
        return c is not None and (int(row["train_abnormal"]), int(row["test_abnormal"])) != (
            c.train,
            c.test,
        )
    except (KeyError, TypeError, ValueError):
        return True


def _write_seal(results: Path, cells: dict[str, str]) -> None:
    record = {"format": SEAL_FORMAT, "cells": dict(sorted(cells.items()))}
    atomic_write(_seal_file(results), json_text(record, indent=1).encode())


def _training_cells(method: str, trial) -> np.ndarray:
    """The dataset indices ``method`` trains on in ``trial``: the normal bags for a one-class
    method, every bag for the others."""
    from cyto.train.registry import get_method

    return trial.normal_bags if get_method(method).one_class else trial.all_bag_cells[0]


def _train_data(method: str, trial, images: np.ndarray, labels: np.ndarray, fp: str):
    from cyto.train.data import TrainData
    from cyto.train.registry import get_method

    cls = get_method(method)
    if cls.one_class:
        idx = _training_cells(method, trial)
        return TrainData(images[idx], labels[idx], fingerprint=fp)
    idx, bag, bag_label = trial.all_bag_cells
    if cls.instance_labels:
        return TrainData(images[idx], labels[idx], fingerprint=fp)
    return TrainData(
        images[idx],
        None,
        np.array([f"bag{b}" for b in bag], dtype=object),
        bag_label.astype(np.int8),
        fingerprint=fp,
    )


@dataclass(frozen=True)
class SweepFiles:
    """What a sweep wrote: the results table, the TP@K tables (Markdown, LaTeX), the plots."""

    results: Path
    tables: tuple[Path, Path]
    plots: list[Path]


def run_sweep(spec: SweepSpec, out: Path, echo=print) -> SweepFiles:
    """Run (or continue) a sweep into ``out``, then make its tables and plots from the results
    table, all under the folder's lock (two sweeps never draw into one folder)."""
    from cyto.eval.report import plots, tp_table
    from cyto.outputs_check import refuse_input_as_output

    out = Path(out)
    configs = method_configs(spec)  # a bad --set fails here, before anything is written
    # its results, models and plots (images) never go into the dataset it reads
    refuse_input_as_output(out, passing("out", out), {"data": spec.data}, inside=("data",))
    made = not out.exists()
    try:
        with OutputLock(out, "cyto eval sweep"):  # one sweep per folder
            results = _sweep(spec, out, configs, echo)
            tables = tp_table(results, out, spec.k)
            return SweepFiles(results, tables, plots(results, out, spec.k))
    finally:  # a refused or failed first run leaves no empty folder behind
        if made and out.is_dir() and not any(out.iterdir()):
            out.rmdir()


def _normal_counts(counts):
    """A record's counts as this sweep writes them ({"9": [train, test]}), so that a number
    written otherwise ("9.0", "2") is the same count; as recorded where it is not one."""
    try:
        return {f"{float(wr):g}": [int(tr), int(te)] for wr, (tr, te) in counts.items()}
    except (AttributeError, TypeError, ValueError):
        return counts


def _said_counts(counts) -> str:
    """A record's abnormal cells per WR, as said: "WR 9 %: 3 training, 3 test; WR 5 %: ..."."""
    try:
        return "; ".join(f"WR {wr} %: {tr} training, {te} test" for wr, (tr, te) in counts.items())
    except (AttributeError, TypeError, ValueError):
        return repr(counts)  # a record edited by hand


def _sweep(spec: SweepSpec, out: Path, configs: dict, echo) -> Path:
    from cyto.bundle import cell_keys, save_bundle
    from cyto.runtime import load_scorer
    from cyto.train.loop import resolve_device
    from cyto.train.registry import get_method

    spec_file = out / "sweep.json"
    spec_json = {k: (str(v) if isinstance(v, Path) else v) for k, v in spec.__dict__.items()}
    if spec_file.exists():
        # settings added since that sweep was written count at their defaults
        defaults = {f.name: f.default for f in fields(SweepSpec) if f.default is not MISSING}
        try:
            recorded = json.loads(spec_file.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(
                f"{spec_file} is damaged ({exc}): delete it and rerun; results.csv keeps the "
                "finished cells"
            ) from None
        previous = {**json.loads(json.dumps(defaults)), **recorded}
        recorded_counts = previous.pop("counts", None)
        reuse = check_reuse(previous, json.loads(json.dumps(spec_json)))
        if not reuse.ok:
            raise ConfigError(
                f"{out} holds a sweep with other settings ({'; '.join(reuse.differs)}; "
                f"{spec_file}); use another --out or delete it"
            )
    dev = resolve_device(spec.device)
    datasets: dict[int | None, PatchDataset] = {}
    for cfg in configs.values():
        if cfg.load_size not in datasets:
            datasets[cfg.load_size] = PatchDataset.from_path(
                spec.data, normal=spec.normal, abnormal=spec.abnormal, size=cfg.load_size
            )
    labels = next(iter(datasets.values())).labels.astype(np.int64)
    protocol = WRProtocol(labels, seed=spec.seed, train_fraction=spec.train_fraction)
    counts = {wr: protocol.counts(wr) for wr in spec.wrs}  # too few abnormal cells: refused here
    # each WR's cells, in the record: a sweep resumed under another count rule would mix rows of
    # two witness rates under one name (hostile round 39, 1)
    spec_json["counts"] = {f"{wr:g}": [c.train, c.test] for wr, c in counts.items()}
    if spec_file.exists() and _normal_counts(recorded_counts) != spec_json["counts"]:
        if recorded_counts is None:  # an earlier cyto's sweep: its counts were the paper's on
            # the paper's pools (as now), twice the asked WR's elsewhere
            paper = protocol.paper_pools and all(wr in PAPER_COUNTS for wr in spec.wrs)
            was = (
                None
                if paper
                else "none recorded (an earlier cyto's sweep: its WR was the abnormal share of "
                "all ten bags, twice a positive bag's)"
            )
        else:
            was = _said_counts(recorded_counts)
        if was is not None:
            raise ConfigError(
                f"{out} holds a sweep of other abnormal cells per witness rate ({was} -> "
                f"{_said_counts(spec_json['counts'])}; {spec_file}): its rows are at other "
                "witness rates; use another --out or delete it"
            )
    results = out / "results.csv"
    if results.exists():
        _read_rows(results)  # a user's results.csv: refused here
    for name in sorted({_bundle_name(m, w) for m in spec.methods for w in spec.wrs}):
        bundle = out / "models" / f"{name}.cyto"
        if bundle.exists() and not (bundle / "manifest.json").is_file():
            raise ConfigError(
                f"{bundle} is not a model bundle this sweep wrote: delete it and rerun, or use "
                f"another {said('out')}"
            )
    # only a sweep that can run claims the folder: a refused command (above) leaves nothing
    # behind, neither a record that would turn its corrected rerun away as "other settings"
    # nor a file in a user's folder
    (out / "models").mkdir(parents=True, exist_ok=True)
    atomic_write(spec_file, json_text(spec_json, indent=2).encode())  # whole, or the last
    n_bag_normals = sum(len(b) for b in protocol.normal_bags)
    echo(
        f"{n_bag_normals} training normals in 10 bags, {len(protocol.test_normals)} held-out "
        "normals"
    )
    for wr, c in counts.items():
        echo(
            f"WR {wr:g}%: train {c.train} abnormal in 5 of 10 bags"
            + (" (the floor: one in each positive bag)" if c.floored else "")
            + " (effective "
            f"{c.effective_train_wr:.3g}% of all bags, {c.positive_bag_wr:.3g}% of the positive "
            f"bags), test {c.test} abnormal among {len(protocol.test_normals)} normal (effective "
            f"{c.effective_test_wr:.3g}%)"
        )
    done = _finished(results, echo, {float(wr): c for wr, c in counts.items()})
    cells = [(m, wr) for m in spec.methods for wr in spec.wrs]
    held_out = np.concatenate([protocol.test_normals, protocol.test_abnormals])
    with progress("sweep", total=len(cells), unit="cells") as bar:
        for method, wr in cells:
            if (method, float(wr)) in done:
                bar.advance()
                continue
            ds = datasets[configs[method].load_size]
            images = np.asarray(ds.images)
            name = _bundle_name(method, wr)
            bundle = out / "models" / f"{name}.cyto"
            if not bundle.exists():
                trial0 = protocol.trial(wr, 0)
                data = _train_data(method, trial0, images, labels, ds.fingerprint)
                model = get_method(method)(configs[method]).fit(data, device=dev)
                # the cells of its training bags, which cyto predict says it scores again
                # (hostile round 40, 1)
                trained = [
                    d
                    for i in _training_cells(method, trial0)
                    for d in (ds.digests[i], ds.pixels[i])
                ]
                save_bundle(
                    bundle, *model.bundle_parts(data), overwrite=True, cells=cell_keys(trained)
                )
                check = getattr(model, "bag_check_", None)
                if check is not None and check["status"] != "ok":
                    echo(f"warning: {name}: {check['message']}")
            scorer = load_scorer(bundle, "torch", str(dev))
            score_of = dict(zip(held_out.tolist(), scorer.score(images[held_out]), strict=True))
            rows = []
            for t in range(spec.trials):
                trial = protocol.trial(wr, t)
                s = np.array([score_of[i] for i in trial.test.tolist()])
                m = all_metrics(s, labels[trial.test], spec.k)
                c = protocol.counts(wr)
                for metric in METRIC_COLUMNS:
                    rows.append(
                        {
                            "method": method,
                            "wr": wr,
                            "trial": t,
                            "train_abnormal": c.train,
                            "test_abnormal": c.test,
                            "effective_wr": round(c.effective_test_wr, 5),
                            "n_test": m["n"],
                            "k": m["k"],
                            "metric": metric,
                            "value": m[metric],
                        }
                    )
            _add_rows(results, rows)
            bar.advance()
    return results


def _bundle_name(method: str, wr: float) -> str:
    """A sweep's model of ``method`` at ``wr`` (``OUT/models/NAME.cyto``): one per one-class
    method (it trains on the normal bags alone, whatever the WR), else one per WR."""
    from cyto.train.registry import get_method

    return method if get_method(method).one_class else f"{method}-wr{wr:g}"


def _add_rows(results: Path, rows: list[dict]) -> None:
    """A finished cell's rows join the table at once: the table is written again beside itself
    and renamed, so a run stopped mid-write leaves the cells before it whole, never a cell with
    some of its trials (which a rerun would take as finished). Then the cell's digest joins
    ``results.seal.json`` (a run stopped between the two computes the cell again)."""
    tmp = results.with_name(f".{results.name}.partial")  # one writer: the folder is locked
    try:
        with open(tmp, "w", newline="") as f:
            if results.exists():
                f.write(results.read_text())
            w = csv.DictWriter(f, fieldnames=FIELDS)
            if not results.exists():
                w.writeheader()
            w.writerows(rows)
        os.replace(tmp, results)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    buf = io.StringIO()
    csv.DictWriter(buf, fieldnames=FIELDS).writerows(rows)
    added = _cell_digests(list(csv.reader(io.StringIO(buf.getvalue()))))
    try:
        sealed = json.loads(_seal_file(results).read_text())["cells"]
    except (OSError, ValueError, KeyError, TypeError):
        sealed = {}
    _write_seal(results, {**sealed, **added})


def _write_rows(results: Path, rows: list[list[str]]) -> None:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(FIELDS)
    w.writerows(rows)
    atomic_write(results, buf.getvalue().encode())
