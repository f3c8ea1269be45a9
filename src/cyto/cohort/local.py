"""Many slides on one machine: one model load, one output folder per slide (names that collide
kept apart), a slide that fails reported while the next goes on, ``cohort.csv`` kept up to date."""

from __future__ import annotations

import json
import os
from pathlib import Path

from cyto.cohort.table import (
    cohort_row,
    failure_words,
    is_cohort_table,
    read_cohort_table,
    say_models,
    write_cohort_table,
)
from cyto.envvars import env_switch
from cyto.errors import (
    CytoError,
    InputPathError,
    OutputBusyError,
    OutputWriteError,
    SlideFailedError,
    out_of_memory,
)
from cyto.infer import ScoreOptions, score_slide
from cyto.infer.finish import Metrics
from cyto.infer.options import as_cut, rank_by_line
from cyto.infer.outputs import read_truth
from cyto.infer.plan import check_model_mpp, no_model_mpp
from cyto.infer.store import KEPT_ROWS, PARTIAL, files_by_name, slide_identity, slide_key
from cyto.location import OutputLocation, output_location
from cyto.locks import OutputLock
from cyto.outputs_check import check_writable
from cyto.runtime import Scorer, load_scorer
from cyto.runtime.scorer import choice_lines
from cyto.slides.base import printable
from cyto.slides.remote import SlideURL, slide_ref


def score_key_names(slide) -> dict[str, str]:
    """The key fields of a finished ``slide`` by the caller's names (the options keep their
    own: ``--top-k`` at the command line, ``top_k`` from Python); from Python, ``model=`` and
    ``truth=``, not MODEL and the --truth file (hostile round 56, 2)."""
    from cyto.flags import named, python_call
    from cyto.infer.store import identity_name

    return {
        "model": f"{'model=' if python_call() else 'MODEL'} (its manifest)",
        "slide": identity_name(slide),
        "slide_files": "the slide's files (its focal planes)",
        "nuclei_file": f"the {named('nuclei')} file's content",
        "truth_file": f"the {named('truth')} file's content",
        "adequacy": f"{named('adequacy')} (the rule, or its file's content)",
    }


def finished_summary(
    target: Path, scorer: Scorer, slide: Path, opts: ScoreOptions, echo
) -> dict | None:
    """The summary of the finished run in ``target`` that a run reuses (:func:`judge_finished`),
    else None."""
    return judge_finished(target, scorer, slide, opts, echo)[0]


def judge_finished(
    target: Path, scorer: Scorer, slide: Path, opts: ScoreOptions, echo
) -> tuple[dict | None, dict | None]:
    """What a ``--resume`` run does with the finished run in ``target``, said once: (its summary
    to reuse, None) when this model scored this very slide there with these options and its
    outputs are still what it wrote: its seal holds (:func:`cyto.seal.read_sealed`: every file it
    wrote has the bytes it wrote, none was added under an output's name) and
    :func:`cyto.reuse.check_reuse` passes (the model, the slide's and side files' content, every
    option that shapes the outputs, the tables and mosaics read back with their rows). When only
    its QuPath outputs differ (``--qupath``, ``--map-um``, or such a file changed, missing or
    added), they are written again from its sealed table and the summary that lists them is
    reused. (None, its summary) when only what is drawn from its table differs (the top-K,
    mosaics, the ranking, error rates, truth, the adequacy rule) and its table holds the cells
    this run would score (:func:`_rows_kept`): the run keeps them
    (:data:`cyto.infer.store.KEPT_ROWS`) and writes the outputs again. (None, None): the slide
    is scored again."""
    from cyto.infer.finish import QUPATH_KEYS, rewrite_qupath
    from cyto.infer.outputs import output_artifacts
    from cyto.infer.qupath import QUPATH_FILES
    from cyto.reuse import check_reuse
    from cyto.seal import SEAL, read_sealed

    if (target / PARTIAL).exists():
        return None, None
    if not (target / "summary.json").is_file() and not (target / SEAL).is_file():
        return None, None  # never finished here (a sealed folder that lost its summary is said)
    # the crop side as a run cuts it (--patch-size, else the model's), as the summary records
    # it: compared as given, every --resume read '--patch-size 192 -> default' and scored again
    opts = as_cut(opts, scorer.spec)
    sealed = read_sealed(target)
    data = sealed.summary
    if data is None:
        echo(f"{slide.name}: {target}: {sealed.words()}; scoring it again")
        return None, None
    if not isinstance(data.get("output_key"), dict):
        echo(f"{slide.name}: {target} records no settings (an older cyto); scoring it again")
        return None, None
    was = (data.get("verification") or {}).get("status")
    now = scorer.verification.status if scorer.verification is not None else None
    if now == "passed" and was != "passed":
        # a run checked here is never answered with scores nothing checked (--skip-verify)
        echo(
            f"{slide.name}: {target}: its scores were not verified when it was scored "
            f"({was or 'no record'}); scoring it again with the graph verified here"
        )
        return None, None
    ran = (data.get("backend"), data.get("precision"))
    if ran[1] is not None and not _as_exact(ran[1], scorer.precision):
        # scores of a coarser precision than this run's engine has are not kept (`--backend
        # onnx --resume` had kept what OpenVINO scored at bf16, unsaid); a finer one's are,
        # said (a plain --resume that auto took to bf16 scored a cohort finished at fp32 again:
        # hostile round 48, 5)
        echo(
            f"{slide.name}: {target}: scored on {ran[0]} at {ran[1]}, this run's engine is "
            f"{scorer.backend.name} at {scorer.precision}; scoring it again"
        )
        return None, None
    recorded = {
        "model": data.get("model_sha256"),
        "slide": data.get("slide_identity"),
        **data["output_key"],
    }
    files = _slide_files(slide, opts) if isinstance(data.get("rows_key"), dict) else None
    current = {
        "model": scorer.bundle.manifest_hash,
        # read once: the first of its files' identities when they were read
        "slide": files["slide"] if files else slide_identity(slide),
        **opts.output_key(),
    }
    if isinstance(data.get("rows_key"), dict):  # and its focal planes' files, as found now
        recorded["slide_files"] = files_by_name(data["rows_key"].get("slide"))
        current["slide_files"] = files
    recorded["adequacy"], current["adequacy"] = _rules_said(
        recorded.get("adequacy"), current.get("adequacy")
    )
    artifacts = output_artifacts(target, data)
    reuse = check_reuse(recorded, current, artifacts, score_key_names(slide))
    if reuse.ok and sealed.ok:
        return data, None
    # all that differs is the QuPath outputs (other ones asked for, or a file changed, missing
    # or added): they are drawn again from the sealed table, the cells not scored again
    qupath_files = set(QUPATH_FILES.values())
    rest = check_reuse(
        {**recorded, **{f: current.get(f) for f in QUPATH_KEYS}},
        current,
        [a for a in artifacts if Path(a.path).name not in qupath_files],
        score_key_names(slide),
    )
    if (
        rest.ok
        and set(sealed.changed_names) <= qupath_files
        and isinstance(data.get("outputs"), dict)
    ):
        data = rewrite_qupath(target, data, opts, slide)
        because = [*reuse.differs, *reuse.broken, *sealed.changed]
        echo(
            f"{slide.name}: {target}: QuPath outputs written again from its table "
            f"({'; '.join(dict.fromkeys(because))})"
        )
        return data, None
    why = []
    if not sealed.ok:
        why.append(sealed.words())
    if reuse.differs:
        why.append(f"it was scored with other settings or inputs ({'; '.join(reuse.differs)})")
    if reuse.broken and sealed.ok:
        why.append(f"it does not hold what it wrote ({'; '.join(reuse.broken)})")
    kept, unsaid = _rows_kept(data, sealed, recorded, current, artifacts, scorer, opts)
    if kept:
        echo(
            f"{slide.name}: {target}: {' and '.join(why)}; its cells are kept, and its outputs "
            "written again from them"
        )
        return None, data
    why += unsaid
    # a warning: --resume (resume=True) was asked to keep what it finds, and this replaces it
    # (from Python with echo=None it was nowhere: hostile round 26, 4)
    echo(f"warning: {slide.name}: {target}: {' and '.join(why)}; scoring it again")
    return None, None


def _rules_said(was, now) -> tuple:
    """Two adequacy rules (their fields, as keys record them; None: none) as a change is said:
    by name when the names differ or one side has none ("general -> none"), field by field
    when one rule's fields changed (an edited rule file). Equal ones stay equal: the rules were
    said as their fields, sources and all, in lines of 1-2 kB (hostile round 77, 6)."""
    if was == now:
        return was, now
    if isinstance(was, dict) and isinstance(now, dict) and was.get("name") == now.get("name"):
        return was, now

    def name(rule):
        return "none" if rule is None else rule.get("name") if isinstance(rule, dict) else rule

    return name(was), name(now)


def _slide_files(slide, opts: ScoreOptions) -> dict | None:
    """The slide's files as a run now finds them (the slide, and its focal planes by
    ``--planes``: sibling files that appeared since it was scored change its cells; a plain
    resume reused a table scored without them, hostile round 77, 3), by name and content;
    None where they cannot be found (the run then says why)."""
    from cyto.slides.planes import find_planes

    try:
        return files_by_name(slide_key(slide, find_planes(slide, opts.planes)))
    except Exception:  # noqa: BLE001 - said by the run, in its words
        return None


def _rows_kept(data, sealed, recorded, current, artifacts, scorer, opts) -> tuple[bool, list]:
    """(whether a finished run's table holds the cells this run would score, so that only what
    is drawn from it differs; why not, where the caller's line does not say it): its model (its
    calibration aside:
    :attr:`cyto.bundle.Bundle.rows_id`), slide and the options that shape rows must be this
    run's, it scored on this engine (backend, device, precision, graph: what its table says
    scored it), its table is as it was written, and it records the key of its rows (checked
    against the slide's plan when the run starts: :func:`cyto.infer.store.rows_differ`). The
    reasons returned are those the caller's line does not give (the engine, the crops'
    sharpness, an older cyto's table); the others are among the settings and files it names."""
    from cyto.flags import passing
    from cyto.reuse import check_reuse

    # the precision asked for aside: the one the engine ran at is compared below (`auto` that
    # took fp32 scored the cells `--precision fp32` scores: hostile round 77, 8)
    rows = ("slide", "slide_files", "nuclei_file", *opts.result_key().keys() - {"precision"})
    table = [a for a in artifacts if Path(a.path).name == "scores.parquet"]
    key = data.get("rows_key")
    if not isinstance(key, dict):
        return False, ["its table records no key of its rows (an older cyto)"]
    why = []
    named = (  # said by the caller: a setting, the model or the table
        key.get("model") != scorer.bundle.rows_id
        or len(table) != 1
        or "scores.parquet" in sealed.changed_names
        or not check_reuse(
            {f: recorded.get(f) for f in rows}, {f: current.get(f) for f in rows}, table
        ).ok
    )
    was = [data.get(f) for f in ("backend", "device", "precision")]
    now = [scorer.backend.name, scorer.device, scorer.precision]
    if was != now:
        why.append(f"its cells were scored on {'/'.join(map(str, was))}, this run's engine is "
                   f"{'/'.join(now)}")  # fmt: skip
    elif data.get("graph") != scorer.graph_ran:
        why.append(f"its cells were scored by another graph ({data.get('graph')})")
    if opts.adequacy_rule() is not None and not key.get("sharpness"):
        # crops' sharpness is measured only under an adequacy rule: none then, none to judge by
        why.append(
            "its crops' sharpness, which the adequacy rule judges, was not measured "
            f"({passing('adequacy', 'none')})"
        )
    return not (named or why), why


def score_one(slide: Path, target: Path, scorer: Scorer, opts: ScoreOptions, echo, metrics) -> dict:
    """One slide of a cohort into ``target``: with ``opts.resume``, a finished run of this model
    on this very slide is reused, an interrupted one continued."""
    from cyto.outputs_check import UNFINISHED_AT_START, FinishedMeanwhile

    if slide.exists() and opts.resume:  # a file, or a DICOM slide's folder
        once = said_once(echo)  # why a finished run is not reused, said at one look
        previous, kept = _reused(target, scorer, slide, opts, once)
        if previous is not None:
            return previous
        token = UNFINISHED_AT_START.set(True)  # finished by another run meanwhile: reused
        try:
            return _score_keeping(kept, slide, target, scorer, opts, echo, metrics)
        except FinishedMeanwhile:
            previous, kept = _reused(target, scorer, slide, opts, once)
            if previous is not None:
                return previous
        finally:
            UNFINISHED_AT_START.reset(token)
        return _score_keeping(kept, slide, target, scorer, opts, echo, metrics)
    return score_slide(slide, scorer, target, opts, echo=echo, metrics=metrics)


def say_interrupted(echo, done: int, total: int, where) -> None:
    """A cohort stopped by Ctrl-C after ``done`` of ``total`` slides were finished in
    ``where``: how to go on, said by a run here and on Ray alike (a plain rerun refuses their
    folders: hostile round 10, N41; a Ray run said only "interrupted": round 78, 2)."""
    from cyto.flags import passing

    if done:
        echo(
            f"interrupted after {done} of {total} slides were finished in {where}: rerun with "
            f"{passing('resume')} to keep them and continue"
        )


def said_once(echo):
    """``echo`` that says each line once: a finished run is judged again when the run holds its
    folder's lock (or by a Ray engine before it), saying the same."""
    said: set[str] = set()

    def once(line: str) -> None:
        if line not in said:
            said.add(line)
            echo(line)

    return once


def _score_keeping(kept: dict | None, slide, target, scorer, opts, echo, metrics) -> dict:
    """:func:`score_slide`, starting from the cells of the finished run ``kept`` summarises,
    when :func:`judge_finished` found they serve (:data:`~cyto.infer.store.KEPT_ROWS`)."""
    rows = KEPT_ROWS.set(None if kept is None else (target, kept))
    try:
        return score_slide(slide, scorer, target, opts, echo=echo, metrics=metrics)
    finally:
        KEPT_ROWS.reset(rows)


#: how exact each precision's scores are: a finished run's are kept by a run whose engine's
#: are no more exact (fp16 and bf16 apart: neither is the other's)
_EXACTNESS = {"fp32": 3, "fp16": 2, "bf16": 2, "int8": 1}


def _as_exact(was: str, now: str) -> bool:
    """Whether scores made at ``was`` serve a run at ``now``: the same precision, or finer."""
    return was == now or _EXACTNESS.get(was, 0) > _EXACTNESS.get(now, 0)


def _reused(
    target: Path, scorer: Scorer, slide: Path, opts: ScoreOptions, echo
) -> tuple[dict | None, dict | None]:
    """(the summary of the finished run in ``target`` that this one reuses (said), the summary
    whose cells it keeps): :func:`judge_finished`."""
    previous, kept = judge_finished(target, scorer, slide, opts, echo)
    if previous is None:
        return None, kept
    # when it was scored, not how long that took: the report says nothing ran now
    when = scored_when(target)
    # scored by another engine (another backend at this precision, the same scores within
    # what verification allows; or a finer precision), said as such
    other, at = previous.get("backend"), previous.get("precision")
    by = (
        f", on {other} at {at}"
        if other is not None and (other, at) != (scorer.backend.name, scorer.precision)
        else ""
    )
    echo(SkippedLine(f"{slide.name}: already scored ({when}{by}) in {target}; skipping"))
    return {**previous, REUSED: when}, None


class SkippedLine(str):
    """The line that says a finished slide is reused as it is: a watch leaves it to the slide's
    own report line (three lines a kept slide on each restart: hostile round 76, 10)."""

    __slots__ = ()


#: the key a reused slide's summary gets in a run's report (when its outputs were written);
#: its ``seconds`` and rates are the earlier run's, never reported as this run's
REUSED = "reused_from"


def scored_when(target: Path) -> str:
    """When the finished outputs in ``target`` were written (its seal's time, written last), in
    UTC to the minute."""
    import datetime

    from cyto.seal import SEAL

    try:  # the time the seal records (a copied folder's files carry the copy's time)
        sealed_at = json.loads((target / SEAL).read_text()).get("sealed_at")
    except (OSError, ValueError, AttributeError):
        sealed_at = None
    if isinstance(sealed_at, str) and sealed_at:
        return sealed_at
    stamp = (target / SEAL) if (target / SEAL).is_file() else (target / "summary.json")
    when = datetime.datetime.fromtimestamp(stamp.stat().st_mtime, datetime.UTC)
    return when.strftime("%Y-%m-%d %H:%M UTC")


def score_at(
    slide: Path, where: OutputLocation, scorer: Scorer, opts: ScoreOptions, echo, metrics
) -> dict:
    """:func:`score_one` into the output folder ``where`` (a local folder, or a slide's folder
    under a prefix in object storage: pulled into its staging folder first, so what is reused
    is what the prefix holds, and published after, ``seal.json`` last, its staged copy then
    removed). Messages and errors name the prefix, never the staging folder."""

    def said(message: str) -> None:
        echo(where.words(message))

    with where.writing():
        summary = score_one(slide, where.local, scorer, opts, said, metrics)
    uploaded = where.uploaded_words(slide.name)
    if uploaded:
        echo(uploaded)
    return summary


def stage(where: OutputLocation, slides: list[Path]) -> None:
    """Before the folders of ``slides`` are chosen under a prefix in object storage: its
    ``cohort.csv`` and every folder that may hold one of them (``STEM``, ``STEM-<hash>``) are
    pulled into the staging folder, where :func:`output_folders`, the refusal of finished
    results and ``--resume`` read them. Nothing for a local folder."""
    import re

    if not where.is_remote:
        return
    where.check()
    from cyto.seal import SEAL

    stems = {printable(_as_named(s).stem) for s in slides}
    pattern = re.compile(r"(.*?)(-[0-9a-f]{8})?")
    folders = where.folders()
    pulled = set()
    for name in folders:
        if pattern.fullmatch(name).group(1) in stems or name in stems:
            try:
                where.child(name).pull()
                pulled.add(name)
            except OutputBusyError:  # that slide fails alone, saying so, when it is scored
                continue
    where.pull(("cohort.csv",))
    # the rows of slides other runs (other machines) scored into the prefix are checked
    # against their folders' seals as local rows are (cohort.table): their summaries and
    # seals, not their tables, are pulled for it
    for row in read_cohort_table(where.local / "cohort.csv"):
        name = Path(str(row.get("output") or "")).name
        if name in folders and name not in pulled:
            where.child(name).pull(("summary.json", SEAL))


def refuse_slide_folder(out: Path) -> None:
    """``cyto score --out`` names the folder each slide gets a folder in: a slide's own output
    folder given there (a finished, sealed one) had the slide's folder and ``cohort.csv``
    written inside it (``o/s2/s2/``). Refused in one line naming the folder that holds it."""
    import json

    from cyto.flags import passing
    from cyto.seal import SEAL, SUMMARY

    out = Path(out)
    finished = (out / SUMMARY).is_file() and (out / "scores.parquet").is_file()
    if not ((out / SEAL).is_file() or finished):
        return
    try:
        slide = Path(str(json.loads((out / SUMMARY).read_text()).get("slide") or "")).name
    except (OSError, ValueError, AttributeError):
        slide = ""
    of = f" ({slide})" if slide else ""
    raise InputPathError(
        f"{passing('out', out)} is the output folder of one slide{of}: give the folder that "
        f"holds it ({out.parent}), where each slide gets a folder of its own"
    )


def refuse_cohort_folder(out: Path, slide_name: str, field: str = "out") -> None:
    """The mirror of :func:`refuse_slide_folder`: a slide's own output folder (``score_slide``'s
    ``out``, ``cyto bench slide --work``) given as a folder ``cyto score`` wrote for its slides
    (its ``cohort.csv``, or slide folders of results inside) had the slide's results written
    among theirs, and ``cyto score`` then refused the whole folder as one slide's (hostile round
    35, 1). Refused in one line, whatever ``overwrite`` says, naming a folder of the slide's own.
    What is cyto's is told by what cyto writes, never by a name alone: a ``cohort.csv`` with its
    ``slide`` and ``output`` columns, a sub-folder of results cyto wrote (:func:`cyto.seal.
    scored_by_cyto`) or a stopped run's record; a user's own ``summary.json`` or table of
    patients is not (round 36, 2)."""
    from cyto.flags import passing
    from cyto.seal import scored_by_cyto

    out = Path(out)
    if not out.is_dir():
        return
    if is_cohort_table(out / "cohort.csv"):
        what = "its cohort.csv"
    else:
        held = [
            p.name
            for p in sorted(out.iterdir())
            if p.is_dir() and (scored_by_cyto(p) or (p / PARTIAL / "state.json").is_file())
        ]
        if not held:
            return
        what = f"the results of {held[0]}/" + (f" and {len(held) - 1} more" if held[1:] else "")
    raise InputPathError(
        f"{passing(field, out)} is a folder cyto score wrote for the slides it scored ({what}): "
        f"give a folder of this slide's own, such as "
        f"{passing(field, out / Path(slide_name).stem)}"
    )


def check_out_folder(out: Path) -> None:
    from cyto.flags import passing

    if Path(out).exists() and not Path(out).is_dir():
        raise InputPathError(
            f"{passing('out', out)} is a file; give a folder (it is created if missing)"
        )


def check_inputs(out: Path, opts: ScoreOptions, model: Path | Scorer | None = None) -> None:
    """Every input the options name, checked before any work starts (a bad --truth or
    --nuclei file used to surface only after a whole slide was scored); ``out`` is never the
    model bundle nor inside it (:func:`cyto.outputs_check.refuse_input_as_output`)."""
    from cyto.flags import passing
    from cyto.outputs_check import refuse_input_as_output

    if model is not None:
        bundle = model.bundle.path if isinstance(model, Scorer) else model
        refuse_input_as_output(Path(out), passing("out", out), {"MODEL": bundle})
    check_out_folder(out)
    check_writable(out)
    read_cohort_table(Path(out) / "cohort.csv")  # one it cannot update: said before any work
    if opts.truth is not None:
        read_truth(opts.truth)
    if opts.nuclei is not None and not Path(opts.nuclei).is_file():
        from cyto.flags import passing

        what = "is a folder, not a table" if Path(opts.nuclei).is_dir() else "does not exist"
        raise InputPathError(f"{passing('nuclei', opts.nuclei)} {what}")


def _resolved(path):
    """The slide's real path; one that cannot be resolved (a symlink loop) stays as given, so
    that slide fails on its own when it is opened and the cohort goes on. A URL is itself."""
    path = slide_ref(path)
    if isinstance(path, SlideURL):
        return path
    try:
        return path.resolve()
    except (RuntimeError, OSError):
        return path.absolute()


def _as_named(path):
    """The slide as the user named it, made absolute: a symbolic link stays the link, whose
    name (a case number linked to an archive's file) names its output folder and every line
    and table of its run; its target is read (the real file's name was said everywhere: a
    link made to pseudonymize a slide did not; hostile round 66, 6). A URL is itself."""
    path = slide_ref(path)
    if isinstance(path, SlideURL):
        return path
    return Path(os.path.abspath(path))


#: what :func:`_holder` says of a folder whose ``summary.json`` cyto did not write
FOREIGN = ("", "foreign")


def _holder(folder: Path) -> tuple[str, str] | None:
    """(slide path, slide identity) of the run ``folder`` holds: a finished one (its summary)
    or an interrupted one (its chunk store's key); :data:`FOREIGN` when its ``summary.json`` is
    not cyto's (:func:`cyto.seal.written_by_cyto`); None when it holds neither."""
    from cyto.seal import written_by_cyto

    try:
        summary = folder / "summary.json"
        if summary.is_file() and not written_by_cyto(folder):
            return FOREIGN
        if summary.is_file():
            data = json.loads(summary.read_text())
            return str(data.get("slide") or ""), str(data.get("slide_identity") or "")
        state = folder / PARTIAL / "state.json"
        if state.is_file():
            for path, identity in (json.loads(state.read_text()).get("slide") or {}).items():
                return str(path), str(identity)  # the slide comes first, its planes after it
    except (OSError, ValueError, AttributeError):
        return None
    return None


def _held_by_another(folder: Path, slide: Path) -> str | None:
    """What ``folder`` holds that is not this slide's, in words (the results of another slide,
    or a ``summary.json`` cyto did not write), or None when it is free or holds this slide's:
    the same file (even changed since: then it is scored again there), or the same content
    moved or copied (the slide identity)."""
    held = _holder(folder)
    if held is None:
        return None
    if held == FOREIGN:
        return FOREIGN_WORDS
    path, identity = held
    if isinstance(slide, SlideURL) and path == str(slide):
        return None  # the same URL (its changed content is scored again there)
    local = path and not isinstance(slide_ref(path), SlideURL)
    if local and Path(path).is_absolute() and _resolved(Path(path)) == _resolved(slide):
        return None
    try:
        if identity and identity == slide_identity(slide):
            return None
    except OSError:  # an unreadable slide fails on its own when it is opened
        return None
    return f"the results of another slide ({path or 'an unnamed slide'})"


def held_by_another(folder: Path, slide) -> str | None:
    """What ``folder`` holds of another slide than ``slide`` (a path or URL as given), in words,
    or None: the rule that keeps :func:`output_folders` from giving one slide's folder to
    another, for a caller that names the folder itself (``cyto.score_slide(..., resume=True)``)."""
    return _held_by_another(folder, _as_named(slide))


#: a folder holding a summary.json cyto did not write, as :func:`_held_by_another` says it
FOREIGN_WORDS = "summary.json, which cyto did not write"


def output_folders(slides: list[Path], out: Path, echo=None) -> list[tuple[Path, Path]]:
    """(slide, its output folder): ``OUT/STEM``, or ``OUT/STEM-<hash of the path>`` for a slide
    whose name collides with another of the cohort (``a/slide.ndpi`` and ``b/slide.ndpi``) or
    with the slide an earlier run left in ``OUT/STEM``, so no slide's results can replace
    another's. ``out`` is taken by its real path (one folder spelled two ways is one cohort);
    the same slide listed twice (or by a link to it) is scored once, by the name
    it was first given. A slide is named by its path as given, a link by its own name
    (:func:`_as_named`). ``echo`` says why a folder is not ``OUT/STEM``."""
    import hashlib

    first: dict = {}
    for s in slides:
        first.setdefault(_resolved(s), _as_named(s))
    unique = list(first.values())
    stems: dict[str, int] = {}
    for s in unique:
        stems[s.stem] = stems.get(s.stem, 0) + 1
    out = _resolved(Path(out))
    pairs = []
    taken: set[str] = set()
    for s in unique:
        kept = _folder_holding(out, s, taken)
        if kept is not None:  # an earlier run's folder of this very slide: resumed or reused there
            taken.add(kept.name)
            pairs.append((s, kept))
            continue
        name = s.stem
        other = _held_by_another(out / name, s) if stems[s.stem] == 1 else None
        if stems[s.stem] > 1 or other is not None:
            digest = hashlib.sha1(str(s).encode("utf-8", "surrogateescape")).hexdigest()
            name = f"{s.stem}-{digest[:8]}"
        if echo is not None and stems[s.stem] > 1:
            echo(f"note: another slide of this cohort is also named {s.name}: {s} -> {out / name}")
        elif echo is not None and other is not None:
            echo(f"note: {out / s.stem} holds {other}; {s} goes to {out / name}")
        taken.add(name)
        pairs.append((s, out / name))
    return pairs


def _folder_holding(out: Path, slide: Path, taken: set[str]) -> Path | None:
    """The folder under ``out`` that an earlier run gave ``slide`` (``OUT/STEM``, or
    ``OUT/STEM-<hash>`` when its name collided then), found by the slide the folder records: a
    slide scored alone first and beside a namesake later keeps its folder, never gets a second
    one (and a second row in ``cohort.csv``)."""
    import re

    if not out.is_dir():
        return None
    pattern = re.compile(re.escape(slide.stem) + r"(-[0-9a-f]{8})?")
    candidates = sorted(
        (f for f in out.iterdir() if pattern.fullmatch(f.name) and f.name not in taken),
        key=lambda f: (f.name != slide.stem, f.name),
    )
    for folder in candidates:
        held = _holder(folder)
        if held is not None and _held_by_another(folder, slide) is None:
            return folder
    return None


def slide_folders(slides: list[Path], out: Path, echo=None) -> list[tuple[Path, Path]]:
    """:func:`output_folders`, each folder named in UTF-8: a slide whose file name is not UTF-8
    (``slide-\\xff.tif``) goes to ``OUT/slide-\\xff``, so the tables, JSON and web pages under
    OUT (Parquet and JSON take UTF-8 paths and text only) can always be written and read back;
    the slide itself is read under its own name."""
    return [
        (slide, target.with_name(printable(target.name)))
        for slide, target in output_folders(slides, out, echo)
    ]


def once_per_cohort(echo):
    """``echo`` that says the model's own warnings (the same for every slide) once."""
    seen: set[str] = set()

    def say(message: str) -> None:
        if message == no_model_mpp():
            if message in seen:
                return
            seen.add(message)
        echo(message)

    return say


def twins_said(echo):
    """``say(slide, summary)``: a note when a slide of this run (a cohort, a watch) holds the
    content of one before it under another name (their content identity,
    :func:`cyto.infer.store.slide_identity`): both were scored and counted in cohort.csv with
    no word (a scan copied in twice: hostile round 76, 8). Slides on this machine only: a
    server's version of an object (its time of change) is no content identity."""
    first: dict[str, Path] = {}

    def say(slide: Path, summary: dict) -> None:
        identity = summary.get("slide_identity")
        if not identity or isinstance(slide_ref(slide), SlideURL):
            return
        earlier = first.setdefault(identity, Path(slide))
        if earlier != Path(slide):
            echo(
                f"note: {Path(slide).name} holds the same slide as {earlier.name} (the same "
                "content): both are scored, and each counts in cohort.csv; remove the copy if "
                "it is one"
            )

    return say


def open_model(model: Path, opts: ScoreOptions, echo) -> Scorer:
    """The cohort's scorer, loaded (and verified) once; the console says which engine and why."""
    scorer = load_scorer(model, opts.backend, opts.device, opts.precision, verify=opts.verify)
    check_model_mpp(scorer, opts)  # once for the cohort, not once per slide
    echo(f"model {model} ({scorer.bundle.method}) on {scorer.describe()}")
    # what ranks the cells, and why (in summary.json alone, while ``score``, the first score
    # column, is the model's: a Pap bundle ranked by its morphometry, hostile round 58, 6)
    echo(f"  {rank_by_line(scorer, opts.rank_by)}")
    for line in choice_lines(scorer):
        echo(f"  {line}")
    if scorer.verification is not None:
        unverified = scorer.verification.warning(model)
        if unverified:
            echo(f"warning: {unverified}")
    return scorer


def unforeseen(slide: Path, exc: Exception) -> SlideFailedError:
    """A failure of one slide that cyto does not foresee, as the one line its cohort reports
    (``CYTO_DEBUG=1`` raises it instead, with its traceback). A Ctrl-C that a library turned
    into this error stops the cohort, as a Ctrl-C does."""

    import cyto.interrupts as interrupts

    interrupts.check()
    if env_switch("CYTO_DEBUG"):
        raise exc
    if out_of_memory(exc):  # the machine's limit, not a bug: the sizes that take memory named
        from cyto.flags import said

        lower = ", ".join(said(f) for f in ("tile", "batch_size"))
        return SlideFailedError(
            f"out of memory scoring {printable(slide)}: lower {lower} or {said('workers')}; "
            "the other slides go on"
        )
    return SlideFailedError(
        f"{printable(slide)}: failed unforeseen ({type(exc).__name__}: {printable(exc)}); the "
        "other slides go on. Please report it, with the traceback CYTO_DEBUG=1 shows"
    )


def score_cohort(
    slides: list[Path],
    model: Path,
    out: Path,
    opts: ScoreOptions,
    echo=print,
    metrics: Metrics | None = None,
) -> tuple[list[dict], list[tuple[Path, CytoError]]]:
    """Score several slides with one model load; a slide that fails is reported, the next goes
    on. Returns (summaries, failures as (slide, error)). ``out``: a folder, or a prefix in
    object storage (:class:`~cyto.location.OutputLocation`)."""
    where = output_location(out)
    echo = echo_for(where, echo)
    check_inputs(where.local, opts, model)
    refuse_slide_folder(where.local)
    stage(where, slides)
    out = where.local
    pairs = slide_folders(slides, out, echo)
    busy = [OutputLock(target).busy() for _, target in pairs]
    if pairs and all(busy):  # every slide would be refused: before the model loads and talks
        raise busy[0]
    scorer = open_model(model, opts, echo)
    done, failed, rows = [], [], []
    table_failed: CytoError | None = None
    if len(pairs) < len(slides):
        echo(f"note: {len(slides) - len(pairs)} slide(s) listed twice are scored once")
    said = once_per_cohort(echo)
    twins = twins_said(echo)
    for i, (slide, target) in enumerate(pairs, 1):
        if len(pairs) > 1:  # which slide the warnings and the progress bar below are about
            echo(f"slide {i}/{len(pairs)}: {slide}")
        try:
            summary = score_at(slide, where.child(target.name), scorer, opts, said, metrics)
            twins(slide, summary)
            done.append(summary)
            rows.append(cohort_row(slide, target, summary))
        except KeyboardInterrupt:
            say_interrupted(echo, len(done), len(pairs), where)
            raise
        except CytoError as exc:
            failed.append((slide, exc))
            rows.append(cohort_row(slide, target, None, str(exc), another_run=exc.another_run))
        except Exception as exc:  # whatever one slide does, the next is scored
            failed.append((slide, where.translated(unforeseen(slide, exc))))
            rows.append(cohort_row(slide, target, None, str(failed[-1][1])))
        if failed and failed[-1][0] is slide and i < len(pairs):
            # said when it happens, not only at the end of a long cohort (hostile round 49, 2)
            echo(failed_now(slide, failed[-1][1]))
        if Path(out).is_dir():
            later = (t.name for _, t in pairs[i:])  # scored next: their rows not said now
            write_cohort_table(rows, Path(out) / "cohort.csv", later)
            table_failed = _publish_table(where, table_failed, echo)
    if table_failed is not None:  # said after the slides' own lines, which it must not hide
        failed.append((Path("cohort.csv"), table_failed))
    say_models(Path(out) / "cohort.csv")  # the table as this run leaves it
    return done, failed


def failed_now(slide, exc: Exception) -> str:
    """The line said when a slide of a cohort fails, before the next slide starts (each is said
    again with the others at the end)."""
    return f"{failure_words(slide, exc)} (failed; the next slide goes on)"


def _publish_table(where: OutputLocation, before: CytoError | None, echo) -> CytoError | None:
    """Upload ``cohort.csv`` to a prefix after a slide: an upload that fails ends no cohort
    (a store gone read-only ended it after its first slide, and the slide's own line, saying
    its result was kept, was never printed); it is said once, tried again after each slide,
    and what the last try met is returned (None once it went)."""
    from cyto.flags import passing

    try:
        where.publish(("cohort.csv",))
    except CytoError as exc:
        reason = str(exc).removeprefix(f"cannot write the outputs to {where}: ")
        if before is None:
            echo(f"warning: cohort.csv was not uploaded to {where}: {reason}; tried again "
                 "after each slide")  # fmt: skip
        return OutputWriteError(
            f"cohort.csv was not uploaded to {where}: {reason}; each slide's folder is as "
            f"said; run again with {passing('resume')} to upload it"
        )
    return None


def echo_for(where: OutputLocation, echo):
    """``echo`` naming the prefix where a message names the staging folder."""
    if not where.is_remote:
        return echo
    return lambda message: echo(where.words(message))
