"""``cyto doctor``: what this machine can run, and every graph of the given models verified here.

The machine part lists the CPU and the instruction sets that pick ONNX Runtime's kernels, the
slide readers (libvips with or without OpenSlide, openslide-python with its library) and the
formats they open, ONNX Runtime's build and providers, PyTorch with CUDA and the GPUs, TensorRT,
and numba. The model part loads every graph and engine of each bundle on each device here,
verifies it on the bundle's golden cells (:mod:`cyto.runtime.verify`, cached per machine) and
times it, then shows what ``auto`` picks. A check the user asked for that cannot run here (a
``--device`` or ``--precision`` that fails, a model nothing here can score, no slide reader or
no ONNX Runtime at all) makes the exit status non-zero.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from cyto.errors import CytoError, VerificationError
from cyto.flags import passing

OK, MISSING, FAILED, INFO = "ok", "missing", "FAILED", "info"


@dataclass
class Check:
    """One line of the machine part: ``status`` is ok, missing, FAILED or info; ``needed``
    marks what the user asked for (or what cyto cannot work without)."""

    area: str
    item: str
    status: str
    detail: str
    needed: bool = False


@dataclass
class ModelRow:
    """One graph or engine of a model on one device: verified here or not, and its speed."""

    model: str
    device: str
    backend: str
    precision: str
    graph: str
    status: str
    detail: str
    cells_per_s: float | None = None
    asked: bool = False
    #: where the verification's numbers come from: ``ran now`` (run on the golden cells by this
    #: doctor) or ``from the record of WHEN`` (an earlier run's record for these very bytes)
    source: str = ""


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)
    rows: list[ModelRow] = field(default_factory=list)
    auto: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 1 if self.problems else 0

    def as_json(self) -> dict:
        return {
            "checks": [asdict(c) for c in self.checks],
            "models": [asdict(r) for r in self.rows],
            "auto": self.auto,
            "problems": self.problems,
        }


def _version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def cpu_checks() -> list[Check]:
    from cyto.runtime.machine import cpu_info, int8_dot_here, int8_kernels_exact

    cpu = cpu_info()
    form = (
        "int8-cpu (8-bit weights: int8 products sum in int32 here)"
        if int8_dot_here()
        else "int8-cpu7 (7-bit weights: 8-bit weights would saturate in int16 here)"
    )
    measured = int8_kernels_exact()
    if measured is None:
        form += "; from the CPU's flags (ONNX Runtime could not be probed)"
    else:
        form += "; measured on ONNX Runtime's kernels"
        if measured != cpu.int8_dot:
            form += (
                f", against the flags ({'VNNI/AMX' if cpu.int8_dot else 'no VNNI'}): an "
                "emulated or masked CPU"
            )
    return [
        Check("cpu", cpu.model, INFO, f"{cpu.arch}; {' '.join(cpu.flags) or 'flags unknown'}"),
        Check("cpu", "int8 form", INFO, form),
    ]


def slide_checks() -> list[Check]:
    from cyto.slides.dicom import reads_dicom
    from cyto.slides.readers import load_libraries

    load_libraries()  # openslide-python before pyvips, as the readers load them
    out = []
    vips_openslide = False
    openslide_dicom = False
    try:
        import pyvips

        loaders = [n for n in ("tiffload", "openslideload") if pyvips.type_find("VipsForeign", n)]
        vips_openslide = "openslideload" in loaders
        lib = f"{pyvips.version(0)}.{pyvips.version(1)}.{pyvips.version(2)}"
        out.append(
            Check(
                "slides",
                "libvips (pyvips)",
                OK,
                f"libvips {lib}, pyvips {_version('pyvips')}; loaders: {', '.join(loaders)}"
                + ("" if vips_openslide else " (no openslideload: apt install libvips42)"),
            )
        )
    except (ImportError, OSError) as exc:
        out.append(Check("slides", "libvips (pyvips)", MISSING, f"{type(exc).__name__}: {exc}"))
    openslide_ok = False
    try:
        import openslide

        openslide_ok = bool(openslide.__library_version__)
        openslide_dicom = reads_dicom(openslide)
        out.append(
            Check(
                "slides",
                "openslide-python",
                OK,
                f"openslide-python {_version('openslide-python')}, OpenSlide "
                f"{openslide.__library_version__} (openslide-bin {_version('openslide-bin')})",
            )
        )
    except (ImportError, OSError) as exc:
        out.append(Check("slides", "openslide-python", MISSING, f"{type(exc).__name__}: {exc}"))
    formats = []
    if vips_openslide or openslide_ok:
        formats.append("NDPI, SVS (JPEG and JPEG 2000), MRXS, SCN, VMS, BIF (OpenSlide)")
    if openslide_ok and openslide_dicom:
        formats.append("DICOM WSI (a folder of .dcm files; openslide-python)")
    if out[0].status == OK or _version("tifffile"):
        formats.append("pyramidal TIFF / OME-TIFF")
    out.append(
        Check(
            "slides",
            "formats",
            OK if formats else FAILED,
            "; ".join(formats)
            or "no slide reader works: apt install libvips42, or pip install "
            "openslide-python openslide-bin",
            needed=True,
        )
    )
    out.append(remote_check())
    return out


def remote_check() -> Check:
    """Which URLs cyto reads slides from and writes outputs to here (``cyto[remote]``: fsspec
    with s3fs, gcsfs, aiohttp): doctor said nothing of them (hostile round 30, 14)."""
    import importlib.util

    have = importlib.util.find_spec("fsspec") is not None
    libs = {"s3://": "s3fs", "gs://": "gcsfs", "http(s)://, dicomweb+http(s)://": "aiohttp"}
    found = [f"{url} ({lib} {_version(lib)})" for url, lib in libs.items()
             if have and importlib.util.find_spec(lib) is not None]  # fmt: skip
    missing = [
        url for url, lib in libs.items() if not have or importlib.util.find_spec(lib) is None
    ]
    detail = "; ".join(found) if found else "none"
    if missing:
        detail += f"; not {', '.join(missing)}: pip install 'cyto[remote]'"
    return Check("slides", "remote slides and outputs", INFO if missing else OK, detail)


def runtime_checks(device_asked: str) -> list[Check]:
    from cyto.runtime.backends.onnxruntime import require_onnxruntime

    out = []
    try:
        ort = require_onnxruntime()
        build = "onnxruntime-gpu" if _version("onnxruntime-gpu") else "onnxruntime"
        both = _version("onnxruntime") and _version("onnxruntime-gpu")
        out.append(
            Check(
                "onnxruntime",
                build,
                FAILED if both else OK,
                f"{ort.__version__}; providers: {', '.join(ort.get_available_providers())}"
                + (
                    "; onnxruntime AND onnxruntime-gpu are both installed: remove one"
                    if both
                    else ""
                ),
                needed=True,
            )
        )
    except CytoError as exc:
        out.append(Check("onnxruntime", "onnxruntime", MISSING, str(exc), needed=True))
    from cyto.runtime.backends.onnxruntime import tensorrt_provider_mismatch

    mismatch = tensorrt_provider_mismatch()
    if mismatch:
        out.append(Check("onnxruntime", "TensorRT provider", FAILED, mismatch))
    out.append(openvino_check())
    out += gpu_checks(device_asked)
    out.append(tensorrt_check(device_asked))
    try:
        import numba

        @numba.njit(cache=False)
        def _add(a, b):  # a compile proves LLVM works here, not just the import
            return a + b

        _add(1, 2)
        # where its kernels are kept: a cache another user made moved them to a private
        # folder in the temp dir without a word (hostile round 41, 5)
        kept = os.environ.get("NUMBA_CACHE_DIR") or "numba's default"
        from cyto.runtime.kernels import moved_why

        if moved_why(kept):
            kept = f"{kept} ({moved_why(kept)})"
        out.append(
            Check(
                "numba", "numba", OK, f"{numba.__version__}; compiles here; kernels kept in {kept}"
            )
        )
    except Exception as exc:  # noqa: BLE001 - any failure to compile is the finding
        out.append(Check("numba", "numba", FAILED, f"{type(exc).__name__}: {exc}", needed=True))
    out.append(cache_check())
    return out


def cache_check() -> Check:
    """cyto's cache folder (kept engines, verifications, kernels): where it is, or why it
    cannot be used (an unusable CYTO_CACHE_DIR stops every run that needs it)."""
    import warnings

    from cyto.cachedir import cache_dir
    from cyto.errors import CytoError

    try:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            path = cache_dir()
    except CytoError as exc:
        return Check("cache", "folder", FAILED, str(exc), needed=True)
    if said:  # the default folder cannot be written: a temporary one stands in
        return Check("cache", "folder", INFO, str(said[0].message))
    # its folders this user cannot write (another user's, in a cache shared by several): what
    # is compiled here is not kept there (hostile round 41, 5: doctor said "ok")
    try:
        theirs = sorted(p.name for p in path.iterdir() if p.is_dir() and not os.access(p, os.W_OK))
    except OSError:
        theirs = []
    if theirs:
        return Check(
            "cache", "folder", INFO,
            f"{path}: this user cannot write its {', '.join(f + '/' for f in theirs)} (another "
            "user's?): what is compiled or verified here is not kept there; give each user a "
            "cache of their own (CYTO_CACHE_DIR)",
        )  # fmt: skip
    return Check("cache", "folder", OK, str(path))


def openvino_check() -> Check:
    """OpenVINO's version and the precisions its CPU plugin offers here (bf16 where it reports
    BF16: AMX or AVX512-BF16), as OpenVINO itself reports them."""
    from cyto.runtime.backends import openvino

    try:
        openvino.require_openvino()
        offered = openvino.precisions_here()
        caps = ", ".join(openvino.cpu_capabilities())
    except CytoError as exc:
        return Check("openvino", "openvino", MISSING, str(exc))
    except Exception as exc:  # noqa: BLE001 - a broken install is the finding
        return Check("openvino", "openvino", FAILED, f"{type(exc).__name__}: {exc}")
    no_bf16 = "" if "bf16" in offered else " (no bf16: no AMX or AVX512-BF16 as OpenVINO sees it)"
    return Check(
        "openvino",
        "openvino",
        OK,
        f"{openvino.version()}; CPU precisions here: {', '.join(offered)}{no_bf16}; "
        f"OPTIMIZATION_CAPABILITIES: {caps}",
    )


def gpu_checks(device_asked: str) -> list[Check]:
    from cyto.runtime.devices import cuda_available
    from cyto.runtime.machine import nvidia_driver

    asked = device_asked.startswith("cuda")
    if importlib.util.find_spec("torch") is None:
        return [Check("cuda", "PyTorch", MISSING, "torch is not installed", needed=asked)]
    if not cuda_available():
        driver = nvidia_driver()
        why = (
            f"driver {driver} present, but PyTorch sees no GPU"
            if driver
            else "no NVIDIA GPU or driver here"
        )
        return [Check("cuda", "GPU", MISSING, why, needed=asked)]
    import torch

    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out.append(
            Check(
                "cuda",
                f"cuda:{i}",
                OK,
                f"{p.name}, compute capability {p.major}.{p.minor}, "
                f"{p.total_memory / 2**30:.0f} GiB; driver {nvidia_driver()}, CUDA "
                f"{torch.version.cuda}, PyTorch {torch.__version__}",
                needed=asked,
            )
        )
    return out


def tensorrt_check(device_asked: str) -> Check:
    from cyto.runtime.backends.tensorrt import require_tensorrt

    try:
        trt = require_tensorrt()
    except CytoError as exc:
        return Check("tensorrt", "tensorrt", MISSING, str(exc))
    return Check("tensorrt", "tensorrt", OK, f"TensorRT {trt.__version__}")


def _speed(scorer, images: np.ndarray) -> float:
    """Cells/s of ``scorer`` on up to 64 golden cells, after one warm-up call of the batch shape
    the timed calls use (ONNX Runtime's CUDA provider searches convolution algorithms for each
    new shape: a smaller warm-up left that search in the timing, 81 cells/s where PyTorch gave
    6,472 on an H200)."""
    x = images[:64]
    scorer.score(x[: min(len(x), scorer.backend.max_batch or len(x))])
    t0 = time.perf_counter()
    scorer.score(x)
    return round(len(x) / max(time.perf_counter() - t0, 1e-9), 1)


def model_rows(
    model: Path, devices: list[str], precision_asked: str | None
) -> tuple[list[ModelRow], dict[str, str], list[str]]:
    """Every (device, backend, precision) of ``model`` that exists here, verified and timed."""
    from cyto.bundle import PRECISIONS, load_bundle
    from cyto.runtime.machine import graph_for
    from cyto.runtime.scorer import graph_of, load_scorer, scorer_artifact
    from cyto.runtime.verify import export_hint, read_golden

    rows, auto, problems = [], {}, []
    try:
        bundle = load_bundle(Path(model), weights=False, for_scoring=True)
        golden = read_golden(bundle)
    except CytoError as exc:  # the error names the bundle first, as a rule: once (round 53, 7)
        said = str(exc)
        return [], {}, [said if said.startswith(str(model)) else f"{model}: {said}"]
    # a damaged fp16 / int8 graph: a problem, and the rows say what scores without it
    problems.extend(gone.refusal() for gone in bundle.set_aside.values())
    images = (
        golden.images
        if golden is not None
        else np.random.default_rng(0).integers(
            0, 256, (16, bundle.spec.crop_size, bundle.spec.crop_size, 3), dtype=np.uint8
        )
    )
    for device in devices:
        cpu = device == "cpu"
        backends = ("onnx", "openvino", "torch") if cpu else ("trt", "onnx", "onnx-trt", "torch")
        passed_any = False
        for precision in PRECISIONS:
            if precision_asked and precision != precision_asked:
                continue
            graph = graph_for(bundle.spec, precision, device)
            # on a CPU every int8 form the bundle holds is checked, the one --precision int8
            # takes here first (a form that fails gives way to the other)
            forms = [graph]
            if cpu and precision == "int8" and graph is not None:
                forms += [
                    g
                    for k, g in sorted(bundle.spec.graphs.items())
                    if k.startswith("int8") and g.file != graph.file
                ]
            for backend, form in [(b, f) for b in backends for f in forms]:
                if backend == "torch" and (precision == "int8" or (precision == "fp16" and cpu)):
                    continue
                # bf16 is OpenVINO's alone (on the CPU), and OpenVINO runs no fp16 graph
                if (precision == "bf16" and backend != "openvino") or (
                    precision == "fp16" and backend == "openvino"
                ):
                    continue
                if backend != "torch" and form is None:
                    continue
                if backend == "torch" and form is not graph:
                    continue
                row = ModelRow(
                    str(model),
                    device,
                    backend,
                    precision,
                    form.file if form is not None and backend != "torch" else "PyTorch",
                    "",
                    "",
                    asked=precision == precision_asked,
                )
                try:
                    scorer = load_scorer(
                        bundle,
                        backend,
                        device,
                        precision,
                        graph=form if len(forms) > 1 else None,  # each CPU int8 form alone
                        recheck=True,  # a failure on record is found again, or not, here
                    )
                except VerificationError as exc:
                    row.status, row.detail = FAILED, _row_failure(str(exc), bundle.path)
                    row.source = "ran now"
                    taken = (
                        graph_of(bundle, backend, "int8", device) if precision == "int8" else None
                    )
                    if cpu and taken is not None and form.file != taken.file:
                        # a form this backend does not take here: why, and which it takes, not
                        # "nothing here reproduces ... --skip-verify" (hostile round 60, 4)
                        row.detail = (
                            f"{_not_taken(bundle.spec.graphs, form.file)}"
                            f"{_failed_words(str(exc), bundle.path)}; not the form {backend} "
                            f"takes for {passing('precision', 'int8')} here ({taken.file})"
                        )
                except CytoError as exc:
                    row.status, row.detail = "cannot run", str(exc)
                else:
                    v = scorer.verification
                    row.status = v.status if v is not None else "unverified"
                    row.detail = v.words() if v is not None else ""
                    row.source = verified_how(v)
                    row.graph = scorer_artifact(scorer.backend)
                    row.cells_per_s = _speed(scorer, images)
                    scorer.close()
                    passed_any = passed_any or row.status == "passed"
                    unchecked = (
                        f"{model} on {device}: its graphs run unverified "
                        f"({v.why if v is not None else 'nothing to check them against'})"
                    )
                    if row.status == "unverified" and unchecked not in problems:
                        problems.append(unchecked)
                rows.append(row)
        if precision_asked and bundle.set_aside_for(precision_asked):
            pass  # made, and damaged: said above
        elif (
            precision_asked
            and precision_asked != "fp32"
            and graph_for(bundle.spec, precision_asked, device) is None
        ):  # none made: "none passes verification" read as one made that failed
            problems.append(
                f"{model} has no {precision_asked} graph: make one with "
                f"{export_hint(bundle, precision_asked)}"
            )
        elif precision_asked and not any(r.status == "passed" for r in rows if r.device == device):
            here = [r for r in rows if r.device == device]
            if here and all(r.status == "cannot run" for r in here):
                # nothing was verified: bf16 on a CPU without it was "no bf16 graph passes
                # verification", of a precision that makes no graph (hostile round 60, 10)
                problems.append(f"{model}: {precision_asked} cannot run on {device} here: "
                                f"{here[0].detail}")  # fmt: skip
            else:
                problems.append(
                    f"{model}: no {precision_asked} graph passes verification on {device}"
                )
        elif not passed_any and not any(r.status == "unverified" for r in rows):
            problems.append(f"{model}: nothing here can score it on {device}")
        try:
            s = load_scorer(bundle, "auto", device, "auto")
            how = verified_how(s.verification)
            ran = [
                r
                for r in rows
                if (r.device, r.backend, r.precision) == (device, s.backend.name, s.precision)
            ]
            if how.startswith("from") and ran and ran[0].source == "ran now":
                # the record its row above just made: "ran now" there, "from the record of"
                # the same minute here read as a contradiction (hostile round 58, 10)
                how = "ran now, its row above"
            status = f"{s.verification.status}, {how}" if how else s.verification.status
            auto[f"{model} on {device}"] = f"{s.describe()} ({status})"
            s.close()
        except CytoError as exc:
            auto[f"{model} on {device}"] = f"nothing: {exc}"
    return rows, auto, problems


def _failed_words(words: str, path) -> str:
    """The failure itself of the scorer's refusal ``words`` (the backend, graph and numbers),
    without what it says of the whole machine; ``words`` as they are where it is no such
    refusal."""
    whole = f"{path}: nothing here reproduces the bundle's golden cells; "
    if not words.startswith(whole):
        return words
    return words[len(whole) :].split(". Use another --precision", 1)[0]


def _row_failure(words: str, path) -> str:
    """A failed verification said of its own row: the scorer's refusal speaks for the whole
    machine ("nothing here reproduces the bundle's golden cells"), which the table's other rows
    may contradict (three passed beside a failed bf16 record: issue 68, hostile round 3)."""
    failed = _failed_words(words, path)
    if failed is words:
        return words
    return (
        f"this row does not reproduce the bundle's golden cells: {failed}; score with a row "
        "that passed (its --backend and --precision), or --skip-verify to score anyway "
        "(recorded)"
    )


def verified_how(v) -> str:
    """``ran now`` or ``from the record of WHEN`` for a passed or failed verification; "" for
    one that did not compare anything (unverified, skipped)."""
    if v is None or v.status not in ("passed", "failed"):
        return ""
    if not v.cached:
        return "ran now"
    when = str(v.record.get("when", ""))[:16].replace("T", " ")
    return f"from the record of {when}" if when else "from a record"


def _not_taken(graphs: dict, file: str) -> str:
    """Why ``--precision int8`` on this CPU does not take the int8 graph ``file``."""
    key = next((k for k, g in graphs.items() if g.file == file), "")
    if key == "int8":
        return "TensorRT's form, for GPUs (a CPU takes the bundle's x86 forms): "
    if key == "int8-cpu":
        return "the 8-bit x86 form, for CPUs whose int8 kernels sum exactly (VNNI, AMX): "
    return ""


def diagnose(models: list[Path], device: str = "auto", precision: str | None = None) -> Report:
    """The machine checks and, for each model, every graph verified here (see the module)."""
    from cyto.cachedir import NUMBA_MOVE_SAID_ELSEWHERE, numba_cache_dir

    NUMBA_MOVE_SAID_ELSEWHERE.add(numba_cache_dir())  # a move of the kernels: in its row alone
    from cyto.bundle import PRECISIONS
    from cyto.runtime.devices import cuda_available, parse_device

    kind, _ = parse_device(device)
    if precision is not None:
        from cyto.flags import check_choice

        check_choice("precision", precision, PRECISIONS)
    report = Report()
    report.checks = cpu_checks() + slide_checks() + runtime_checks(device)
    for c in report.checks:
        if c.needed and c.status != OK:
            report.problems.append(f"{c.area} {c.item}: {c.detail}")
    devices = ["cpu"]
    if kind == "cuda" or (kind == "auto" and cuda_available()):
        devices = ["cuda:0"] if kind == "cuda" else ["cpu", "cuda:0"]
        if kind == "cuda" and not cuda_available():
            devices = []
    for model in models:
        rows, auto, problems = model_rows(model, devices, precision)
        report.rows += rows
        report.auto.update(auto)
        report.problems += problems
    return report


def render(report: Report) -> str:
    """The report as aligned text: machine checks, then one line per graph and device."""
    lines = ["this machine:"]
    width = max((len(f"{c.area} {c.item}") for c in report.checks), default=10)
    for c in report.checks:
        lines.append(f"  {f'{c.area} {c.item}':<{width}}  {c.status:<8} {c.detail}")
    if report.rows:
        lines.append(
            "models (each graph or engine verified on its golden cells here: ran now, or read "
            "from the record an earlier run made on this machine of the very same bytes):"
        )
        head = ("device", "backend", "precision", "status", "cells/s", "graph or engine")
        table = [head] + [
            (
                r.device,
                r.backend,
                r.precision,
                f"{r.status} ({r.source})" if r.source else r.status,
                "" if r.cells_per_s is None else f"{r.cells_per_s:g}",
                r.graph,
            )
            for r in report.rows
        ]
        widths = [max(len(row[i]) for row in table) for i in range(len(head))]

        def line(row) -> str:
            return "    " + "  ".join(f"{v:<{w}}" for v, w in zip(row, widths, strict=True))

        current = None
        for r, row in zip(report.rows, table[1:], strict=True):
            if r.model != current:
                current = r.model
                lines += [f"  {current}", line(head).rstrip()]
            lines.append(line(row).rstrip())
            if r.status not in ("passed", "unverified") and r.detail:
                lines.append(f"      {r.detail}")
        for where, what in report.auto.items():
            lines.append(f"  auto for {where}: {what}")
    if report.problems:
        lines.append("problems (what was asked cannot run, or runs unchecked):")
        lines += [f"  {p}" for p in report.problems]
    else:
        checked = [r for r in report.rows if r.source]
        recorded = [r for r in checked if r.source != "ran now"]
        if recorded:
            lines.append(
                f"everything asked for runs here ({len(recorded)} of {len(checked)} "
                "verifications read from records of earlier runs, not run now)"
            )
        else:
            lines.append("everything asked for runs here")
    return "\n".join(lines)
