"""Cohorts on a Ray cluster: ``cyto score SLIDES... --ray [auto|local|ADDRESS]``.

The unit of work is a slide. Each engine is a Ray actor that loads the model once and scores
whole slides with the very code of a single-machine run (:func:`cyto.cohort.local.score_one`:
decode, detect and crop in worker processes on the actor's node, where the slide is read; the
engine in the actor). One actor per GPU of the cluster, or one per node where there is no GPU
(or ``--device cpu``); slides go to whichever actor is free.

Outputs are the files of a single-machine run (``OUT/SLIDE/scores.parquet``, ...), so slides and
output folder must be on a path every node sees (a shared file system), or in object storage: with
``--out s3://bucket/prefix/`` each actor scores its slide into a staging folder of its own node and
publishes it to ``prefix/SLIDE/`` (:mod:`cyto.location`), and slides read by URL need no shared
folder at all (slides are then scored whole, not in parts: the parts of a slide meet in one
folder). ``OUT/cohort.csv`` is rewritten as each slide finishes, one row per slide with the node
that scored it.

When an actor dies mid-slide (its process killed, its node lost), the driver starts a replacement
and gives the slide to the next free actor with ``resume``: the finished chunks in
``OUT/SLIDE/.partial`` are kept and only the rest is scored, so no cell is lost or written twice
(the chunk store's lock and tile ranges guarantee it). A slide whose workers die
``MAX_ATTEMPTS`` times, or that fails with an error, is reported; the others go on.
"""

from __future__ import annotations

import os
import socket
import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path

from cyto.cohort.parts import tile_ranges
from cyto.cohort.table import cohort_row, say_models, write_cohort_table
from cyto.errors import ConfigError, CytoError, MissingDependencyError, first_line
from cyto.infer.options import ScoreOptions
from cyto.progress import progress
from cyto.slides.remote import is_url, slide_ref

SPLIT_TILES = 256  # a slide with more tiles (1024 px: 256 Mpx of tissue) is scored in parts
MAX_ATTEMPTS = 3  # workers that may die on one slide before it is reported as failed
NEEDS_RAY = "--ray needs Ray on every node: pip install 'cyto[ray]'"


def import_ray():
    try:
        import ray
    except ImportError:
        raise MissingDependencyError(NEEDS_RAY) from None
    return ray


def connect(address: str, num_cpus: int | None = None) -> str:
    """Join (or start) a Ray cluster; returns what was done, in words: "started a local Ray
    cluster at ..." or "joined the Ray cluster at ..." (a started one was said "joined":
    hostile round 67, 10).

    ``auto``: the cluster in ``RAY_ADDRESS`` or the one ``ray start`` left on this machine, else a
    new local one; ``local``: always a new local one (``num_cpus`` of this machine's cores);
    anything else is a cluster address (``HOST:PORT`` or ``ray://HOST:10001``)."""
    ray = import_ray()
    _send_token_if_any()
    if ray.is_initialized():
        return "joined the Ray cluster this process already joined"
    kwargs = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
    # the driver's environment goes to the actors; CYTO_PROGRESS=0 keeps per-tile bars out of logs
    kwargs["runtime_env"] = {"env_vars": {"CYTO_PROGRESS": "0"}}
    note = ""
    if address in ("auto", "local"):
        target, note = auto_target() if address == "auto" else ("local", "")
        if num_cpus is not None:
            kwargs["num_cpus"] = num_cpus
    else:
        target = address
        _check_reachable(address)
    try:
        ctx = ray.init(address=target, **kwargs)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        first = first_line(exc)
        raise ConfigError(
            f"--ray {address}: cannot join a Ray cluster there ({first}); start one with "
            "`ray start --head`, or use --ray local"
        ) from None
    where = getattr(ctx, "address_info", {}).get("gcs_address") or address
    if target == "local":
        cpus = int(ray.cluster_resources().get("CPU", 0))
        return f"started a local Ray cluster at {where} ({cpus} CPUs" + (
            f"; {note})" if note else ")"
        )
    return f"joined the Ray cluster at {where}" + (f" ({note})" if note else "")


def recorded_cluster() -> Path:
    """Where Ray records the cluster ``ray start`` (or a local ``ray.init``) left on this machine:
    ``ray_current_cluster`` in Ray's temp folder ($RAY_TMPDIR, else $TMPDIR on Linux, else /tmp,
    then ``ray/``), as Ray's own ``get_ray_address_file`` finds it."""
    import sys
    import tempfile

    if "RAY_TMPDIR" in os.environ:
        base = os.environ["RAY_TMPDIR"]
    elif sys.platform.startswith("linux") and "TMPDIR" in os.environ:
        base = os.environ["TMPDIR"]
    elif sys.platform.startswith(("linux", "darwin")):
        base = "/tmp"
    else:
        base = tempfile.gettempdir()
    return Path(base) / "ray" / "ray_current_cluster"


def auto_target() -> tuple[str | None, str]:
    """What ``--ray auto`` joins: RAY_ADDRESS, else the recorded cluster when its head still
    answers, else a new local cluster; with a note when a recorded head is gone (a killed
    cluster leaves its record, and Ray would then refuse to start with 'cannot join')."""
    if os.environ.get("RAY_ADDRESS"):
        return None, ""
    record = recorded_cluster()
    try:
        recorded = record.read_text().strip()
    except OSError:  # no cluster recorded: Ray would start a local one (said so)
        return "local", ""
    if not recorded:
        return "local", f"{record} is empty"
    host, _, port = recorded.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=2.0).close()
    except (OSError, ValueError):
        return "local", f"the cluster recorded in {record} ({recorded}) is gone"
    return None, ""


def _send_token_if_any() -> None:
    """A cluster started with ``ray start`` asks for the token it saved (``~/.ray/auth_token``),
    but Ray's client sends one only with ``RAY_AUTH_MODE=token`` set before Ray is imported: set
    it when a token is at hand and the user has not chosen a mode (a new local cluster uses a
    token anyway)."""
    if "RAY_AUTH_MODE" in os.environ:
        return
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token"
    if os.environ.get("RAY_AUTH_TOKEN") or Path(path).is_file():
        os.environ["RAY_AUTH_MODE"] = "token"
        import sys

        if "ray" in sys.modules:  # imported already: its cached config must read the mode again
            try:
                from ray._raylet import Config

                Config.initialize("")
            except (ImportError, AttributeError):
                pass


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail in seconds, not minutes (Ray retries a dead address for over a minute)."""
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(
            f"--ray {address}: give auto, local, or a cluster address HOST:PORT "
            "(e.g. 10.0.0.5:6379, or ray://10.0.0.5:10001)"
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ConfigError(
            f"--ray {address}: nothing answers there ({exc.strerror or exc}); is the cluster "
            "started (`ray start --head` on that machine) and the port open?"
        ) from None


@dataclass(frozen=True)
class Place:
    """Where one engine actor goes: a node, and whether it holds a GPU there."""

    node_id: str
    node_ip: str
    gpu: bool


def engine_places(nodes: list[dict], device: str) -> list[Place]:
    """One actor per GPU of every live node, or one per node without GPUs (or when the engine is
    asked to run on the CPU). ``nodes`` is what ``ray.nodes()`` returns."""
    places = []
    for n in nodes:
        if not n.get("Alive"):
            continue
        gpus = int(n.get("Resources", {}).get("GPU", 0)) if device != "cpu" else 0
        for _ in range(max(gpus, 1)):
            places.append(Place(n["NodeID"], n.get("NodeManagerAddress", "?"), gpus > 0))
    return places


def engine_device(device: str, gpu_ids: list) -> str:
    """The device an engine asks for inside its actor: Ray shows an actor only the GPU it was
    given (as ``cuda:0``), so ``cuda:N`` there means that GPU."""
    if gpu_ids and device.startswith("cuda:"):
        return "cuda"
    return device


class SlideWorker:
    """The engine actor: loads the model once, then scores slides or ranges of their tiles
    (wrapped by ``ray.remote`` in :func:`_actor_class`, so this module imports without Ray).
    Every call returns a dict: the result, the messages the run printed, the node and PID, or
    the error as one line with the exit code it maps to."""

    def __init__(self, model: str, opts: ScoreOptions) -> None:
        import ray

        from cyto.runtime import load_scorer

        os.environ["CYTO_PROGRESS"] = "0"
        # the host, and the Ray node on it (several nodes may share a host)
        self.node = f"{socket.gethostname()}:{ray.get_runtime_context().get_node_id()[:8]}"
        self.scorer, self.error = None, None
        opts = self.opts = replace(opts, device=engine_device(opts.device, ray.get_gpu_ids()))
        try:
            self.scorer = load_scorer(
                Path(model), opts.backend, opts.device, opts.precision, verify=opts.verify
            )
        except CytoError as exc:  # kept for where(): a dead actor's error is a traceback
            self.error = exc

    def where(self) -> dict:
        """Where this engine runs and on what, or why it could not load the model."""
        out = {"node": self.node, "pid": os.getpid()}
        if self.error is not None:
            return {**out, "error": str(self.error), "exit_code": self.error.exit_code}
        v = self.scorer.verification
        return {
            **out,
            "engine": self.scorer.describe(),
            "verification": v.words() if v is not None else None,
        }

    def _call(self, fn, resume: bool, fresh: bool = False) -> dict:
        """``fn(opts, echo)``'s result; ``fresh``: the driver's run found none of its slides
        finished before it began (:data:`cyto.outputs_check.FRESH_ONLY`), so a slide another
        run has finished since is refused here, as a run on one machine refuses it (two Ray
        runs into one --out scored the slides the first had finished again: round 78, 1)."""
        from cyto.outputs_check import FRESH_ONLY

        messages: list[str] = []
        out = {"node": self.node, "pid": os.getpid(), "messages": messages}
        token = FRESH_ONLY.set(fresh)
        try:
            out["result"] = fn(replace(self.opts, resume=resume), messages.append)
        except CytoError as exc:
            out.update(error=str(exc), exit_code=exc.exit_code, another_run=exc.another_run)
        finally:
            FRESH_ONLY.reset(token)
        return out

    def score(
        self, slide: str, target: str, resume: bool, metrics, split: int | None, fresh: bool = False
    ) -> dict:
        """The slide's summary; or, when it has more than ``split`` tiles, ``{"tiles": n}``
        (the driver then sends its tiles out in parts)."""
        from cyto.cohort.local import judge_finished, said_once, score_at
        from cyto.cohort.parts import tiles_beyond
        from cyto.infer.pipeline import refuse_finished_since
        from cyto.location import output_location

        # a slide by URL, or a path; a folder, or a slide's folder under a prefix
        slide_p, where = slide_ref(slide), output_location(target)
        target_p = where.local

        def run(opts, echo):
            once = said_once(echo)  # the judgement below is made again by score_one
            # a finished slide is reused by score_one, however many tiles it has, and so are
            # its cells when only what is drawn from its table differs
            judged = (None, None)
            if split and opts.resume:
                judged = judge_finished(target_p, self.scorer, slide_p, opts, once)
            if split and judged == (None, None):
                refuse_finished_since(slide_p, target_p)  # before its parts are scored
                n = tiles_beyond(slide_p, self.scorer, opts, split)
                if n is not None:
                    return {"tiles": n}
            return {"summary": score_at(slide_p, where, self.scorer, opts, once, metrics)}

        return self._call(run, resume, fresh)

    def part(self, slide: str, target: str, resume: bool, start: int, stop: int) -> dict:
        from cyto.cohort.parts import score_part

        return self._call(
            lambda opts, echo: score_part(
                slide_ref(slide), self.scorer, Path(target), opts, start, stop, echo
            ),
            resume,
        )

    def merge(
        self, slide: str, target: str, ranges: list, metrics, started: float, fresh: bool = False
    ) -> dict:
        from cyto.cohort.parts import merge_parts

        return self._call(
            lambda opts, echo: {
                "summary": merge_parts(
                    slide_ref(slide),
                    self.scorer,
                    Path(target),
                    opts,
                    ranges,
                    echo,
                    metrics,
                    started,
                )
            },
            True,
            fresh,
        )


def _actor_class(ray):
    return ray.remote(max_restarts=0, max_task_retries=0)(SlideWorker)


class _Engines:
    """The pool of engine actors. An engine gets work only once it has started (so a
    replacement that cannot start never holds a slide); a dead one is replaced on its node, or
    anywhere there is room if its node is gone, up to ``MAX_STARTS`` times per place."""

    MAX_STARTS = 4

    def __init__(self, ray, model: Path, opts: ScoreOptions) -> None:
        self.ray, self.model, self.opts = ray, str(model), opts
        self.cls = _actor_class(ray)
        self.places = engine_places(ray.nodes(), opts.device)
        if not self.places:
            raise ConfigError("the Ray cluster has no live node")
        self.idle: deque = deque()
        self.starting: dict = {}  # where() ref -> (actor, place, starts so far)
        self.lost: list[str] = []  # why engines that could not be replaced are gone
        for place in self.places:
            self._start(place, 1)

    def _start(self, place: Place, n: int) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        options = {
            "num_cpus": 0,  # decode workers are processes of the actor's own; nothing to reserve
            "num_gpus": 1 if place.gpu else 0,
        }
        alive = {node["NodeID"] for node in self.ray.nodes() if node.get("Alive")}
        if place.node_id in alive:  # on its node (Ray 2.60 does not keep a soft affinity)
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                place.node_id, soft=False
            )
        actor = self.cls.options(**options).remote(self.model, self.opts)
        self.starting[actor.where.remote()] = (actor, place, n)

    def started(self, ref) -> dict | None:
        """Take the answer of a starting engine: its where() when it is up (then it is idle),
        or None when it died starting (then it is started again, a few times)."""
        from ray.exceptions import RayActorError

        actor, place, n = self.starting.pop(ref)
        try:
            info = self.ray.get(ref)
        except RayActorError as exc:
            if n < self.MAX_STARTS:
                self._start(place, n + 1)
            else:
                self.lost.append(f"{place.node_ip}: {_first_line(exc)}")
            return None
        if "error" in info:  # the model cannot load there: no use starting it again
            self.lost.append(f"{info['node']}: {info['error']}")
            err = CytoError(f"the engine on {info['node']} cannot start: {info['error']}")
            err.exit_code = info["exit_code"]
            raise err
        self.idle.append((actor, place))
        return info

    def replace(self, place: Place) -> None:
        self._start(place, 1)

    def release(self, engine) -> None:
        self.idle.append(engine)

    def __len__(self) -> int:
        return len(self.places)

    def shutdown(self) -> None:
        for actor, _ in self.idle:
            self.ray.kill(actor)
        for actor, _, _ in self.starting.values():
            self.ray.kill(actor)


def score_cohort_ray(
    slides: list[Path],
    model: Path,
    out: Path,
    opts: ScoreOptions,
    address: str = "auto",
    echo=print,
    metrics=None,
    split_tiles: int | None = SPLIT_TILES,
    num_cpus: int | None = None,
) -> tuple[list[dict], list[tuple[Path, CytoError]]]:
    """:func:`cyto.cohort.local.score_cohort` on a Ray cluster (see the module docstring):
    the same outputs, (summaries, failures as (slide, error)). A slide with more than
    ``split_tiles`` tiles is scored in parts of that many tiles by several actors at once
    (None: never)."""
    from cyto.bundle import load_bundle
    from cyto.cohort.local import check_inputs, echo_for, refuse_slide_folder, slide_folders, stage
    from cyto.location import output_location

    where = output_location(out)
    echo = echo_for(where, echo)
    check_inputs(where.local, opts, model)
    refuse_slide_folder(where.local)
    if split_tiles is not None and split_tiles < 1:
        raise ConfigError(f"split_tiles must be >= 1, got {split_tiles}")
    if where.is_remote and split_tiles is not None:
        split_tiles = None  # the parts of a slide meet in one folder, which nodes do not share
        echo(f"--out {where}: each slide is scored whole by one engine (not in parts)")
    load_bundle(Path(model), weights=False, for_scoring=True)  # a bad bundle: one line here
    stage(where, slides)
    ray = import_ray()
    echo(connect(address, num_cpus))
    pairs = slide_folders(slides, where.local, echo)
    if len(pairs) < len(slides):
        echo(f"note: {len(slides) - len(pairs)} slide(s) listed twice are scored once")
    engines = _Engines(ray, model, opts)
    try:
        cohort = _Cohort(ray, engines, where, opts, echo, metrics, split_tiles)
        return cohort.run(pairs)
    finally:
        engines.shutdown()


@dataclass
class _Slide:
    """A slide's way through the cluster."""

    slide: Path
    target: Path
    started: float = 0.0
    ranges: list = field(default_factory=list)
    parts_left: set = field(default_factory=set)
    attempts: int = 1
    nodes: set = field(default_factory=set)
    failed: bool = False


@dataclass
class _Task:
    kind: str  # score | part | merge
    item: _Slide
    resume: bool
    attempt: int = 1
    part: tuple[int, int] | None = None


class _Cohort:
    """The driver: hands tasks to free actors, follows each slide to its end, writes its row
    of cohort.csv as it finishes, and reruns (resuming) what a dead actor was doing."""

    def __init__(self, ray, engines: _Engines, where, opts, echo, metrics, split) -> None:
        self.ray, self.engines, self.opts = ray, engines, opts
        self.where, self.out = where, where.local
        self.echo, self.metrics, self.split = echo, metrics, split
        self.todo: deque[_Task] = deque()
        self.running: dict = {}  # object ref -> (actor, place, task)
        self.done: list[dict] = []
        self.failed: list[tuple[Path, CytoError]] = []

    def run(self, pairs) -> tuple[list[dict], list[tuple[Path, CytoError]]]:
        first = None
        while first is None and self.engines.starting:
            ready, _ = self.ray.wait(list(self.engines.starting), num_returns=1)
            first = self.engines.started(ready[0])
        if first is None:
            raise CytoError(f"no engine could start: {'; '.join(self.engines.lost)}")
        self.echo(
            f"{len(self.engines)} engine actor(s), the first on {first['node']}: {first['engine']}"
        )
        self.todo.extend(_Task("score", _Slide(s, t), self.opts.resume) for s, t in pairs)
        self.out.mkdir(parents=True, exist_ok=True)
        try:
            self._loop(pairs)
        except KeyboardInterrupt:
            self._finished_unsaid()
            from cyto.cohort.local import say_interrupted

            say_interrupted(self.echo, len(self.done), len(pairs), self.where)
            raise
        say_models(self.out / "cohort.csv")  # the table as this run leaves it
        return self.done, self.failed

    def _loop(self, pairs) -> None:
        with progress(f"cohort of {len(pairs)} slides", total=len(pairs), unit="slides") as bar:
            self.bar = bar
            while self.todo or self.running:
                self._dispatch()
                waiting = list(self.running) + list(self.engines.starting)
                if not waiting:  # work left, and no engine running, idle or starting
                    self._give_up()
                    break
                ready, _ = self.ray.wait(waiting, num_returns=1)
                if ready[0] in self.engines.starting:
                    self.engines.started(ready[0])
                else:
                    self._collect(ready[0])

    def _finished_unsaid(self) -> None:
        """Stopped (Ctrl-C): the slides an engine finished whose result the driver had not
        collected yet get their rows of cohort.csv from their sealed folders (a sealed slide's
        row was missing after an interrupt: hostile round 78, 4)."""
        from cyto.seal import SEAL, read_sealed

        for _, _, task in list(self.running.values()):
            item = task.item
            if item.failed or task.kind == "part" or self.where.is_remote:
                continue
            try:  # sealed since this run sent it out: its engine's work, not an earlier run's
                if (item.target / SEAL).stat().st_mtime < item.started:
                    continue
            except OSError:
                continue
            sealed = read_sealed(item.target, summary_only=True)
            if sealed.ok and sealed.summary is not None:
                self.running = {r: v for r, v in self.running.items() if v[2].item is not item}
                self._finish(item, sealed.summary)

    def _give_up(self) -> None:
        why = "; ".join(self.engines.lost) or "every engine died"
        for task in self.todo:
            if not task.item.failed:
                task.item.failed = True
                self._finish(task.item, None, f"{task.item.slide}: no engine left ({why})")
        self.todo.clear()

    def _dispatch(self) -> None:
        from cyto.outputs_check import FRESH_ONLY

        while self.todo and self.engines.idle:
            task = self.todo.popleft()
            if task.item.failed:
                continue  # another part of this slide failed: the rest is not worth scoring
            actor, place = self.engines.idle.popleft()
            # a slide by URL goes with its storage options; a path as text
            s = task.item.slide if is_url(task.item.slide) else str(task.item.slide)
            t = str(task.item.target)
            if self.where.is_remote:  # each node stages the slide's folder on its own
                t = self.where.child(task.item.target.name)
            if task.kind == "score":
                task.item.started = task.item.started or time.time()
                fresh = FRESH_ONLY.get() and not task.resume  # a retry resumes its own
                ref = actor.score.remote(s, t, task.resume, self.metrics, self.split, fresh)
            elif task.kind == "part":
                ref = actor.part.remote(s, t, task.resume, *task.part)
            else:
                ranges = task.item.ranges
                fresh = FRESH_ONLY.get() and task.attempt == 1  # not a merge's own output
                ref = actor.merge.remote(s, t, ranges, self.metrics, task.item.started, fresh)
            self.running[ref] = (actor, place, task)

    def _collect(self, ref) -> None:
        from ray.exceptions import RayActorError, RayTaskError

        actor, place, task = self.running.pop(ref)
        item = task.item
        item.attempts = max(item.attempts, task.attempt)
        try:
            res = self.ray.get(ref)
        except RayActorError as exc:
            self.engines.replace(place)
            why = _first_line(exc)
            what = f"tiles {task.part[0]}..{task.part[1] - 1} of " if task.part else ""
            if task.attempt < MAX_ATTEMPTS:
                alive = {n["NodeID"] for n in self.ray.nodes() if n.get("Alive")}
                then = (
                    "another worker resumes from the finished chunks"
                    if place.node_id in alive
                    else "its node is gone, and the chunks it staged with it: another worker "
                    "scores the slide again"
                )
                self.echo(
                    f"{what}{item.slide.name}: its worker on {place.node_ip} died ({why}); "
                    f"{then} (attempt {task.attempt + 1} of {MAX_ATTEMPTS})"
                )
                task.attempt += 1
                task.resume = True
                self.todo.appendleft(task)
                return
            msg = f"{item.slide}: {MAX_ATTEMPTS} workers died on {what}this slide ({why})"
            res = {"error": msg, "exit_code": 1, "node": place.node_ip}
        except RayTaskError as exc:  # a bug, not a bad input: say it in one line, go on
            self.engines.release((actor, place))
            res = {"error": f"{item.slide}: {_first_line(exc)}", "exit_code": 1, "node": "?"}
        else:
            self.engines.release((actor, place))
        item.nodes.add(res["node"])
        for line in res.get("messages", []):
            self.echo(f"[{item.slide.name} on {res['node']}] {line}")
        if "error" in res:
            if not item.failed:
                item.failed = True
                self._finish(
                    item, None, res["error"], res["exit_code"], res.get("another_run", False)
                )
            return
        result = res["result"]
        if task.kind == "part":
            item.parts_left.discard(task.part)
            if not item.parts_left and not item.failed:
                self.todo.appendleft(_Task("merge", item, True))
        elif "tiles" in result:
            item.ranges = tile_ranges(result["tiles"], self.split)
            item.parts_left = set(item.ranges)
            self.echo(
                f"{item.slide.name}: {result['tiles']} tiles, scored in {len(item.ranges)} "
                f"parts of up to {self.split} tiles"
            )
            for r in reversed(item.ranges):  # a started slide goes first: less left half-done
                self.todo.appendleft(_Task("part", item, task.resume, part=r))
        else:
            self._finish(item, result["summary"])

    def _finish(
        self,
        item: _Slide,
        summary,
        error: str = "",
        exit_code: int = 1,
        another_run: bool = False,
    ) -> None:
        node = " ".join(sorted(item.nodes))
        if summary is not None:
            self.done.append(summary)
            row = cohort_row(item.slide, item.target, summary, node=node, attempts=item.attempts)
        else:
            err = CytoError(error)
            err.exit_code = exit_code
            self.failed.append((item.slide, err))
            row = cohort_row(item.slide, item.target, None, error, node, item.attempts, another_run)
        write_cohort_table([row], self.out / "cohort.csv")
        self.where.publish(("cohort.csv",))
        self.bar.advance(1)
        self.bar.set_postfix(f"{len(self.running)} running, {len(self.failed)} failed")


def _first_line(exc: BaseException) -> str:
    """The cause of a Ray error in one line (Ray's own text is a multi-line traceback)."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {cause}".splitlines()[0]
    return first_line(exc)
