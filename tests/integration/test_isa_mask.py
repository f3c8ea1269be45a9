"""int8 on a CPU without VNNI, run on whatever CPU the suite has: ONNX Runtime picks its int8
kernels by CPUID, and without VNNI they add uint8 x int8 products in int16 pairs, which saturate.
Monkeypatched flags cannot show what those kernels compute; ``tests/isa_mask`` makes a process
see an AVX2-only CPU (its libraries then run AVX2's kernels here: at native speed with CPUID
faulting, else emulated by qemu-user with ``CYTO_ISA_EMULATE=1``), so the path a bundle takes on
such a workstation runs for real: the 7-bit form is chosen by measurement and verified there, and
the 8-bit form computes other numbers than on a VNNI CPU."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

from cyto.bundle import load_bundle
from cyto.export.golden import write_golden
from cyto.export.quantize import export_variant, load_cells
from cyto.runtime import machine
from tests import isa_mask
from tests.cli_runner import run_cyto

pytestmark = [
    pytest.mark.skipif(
        isa_mask.why_unavailable() is not None, reason=str(isa_mask.why_unavailable())
    ),
    # emulated (qemu-user, CYTO_ISA_EMULATE=1), one test takes 3-10 minutes on 2 cores
    *([pytest.mark.timeout(2400)] if isa_mask.way() == "qemu" else []),
]

SEES = """
import json
from numpy._core._multiarray_umath import __cpu_features__ as f
from cyto.runtime.machine import int8_kernels_exact
import subprocess, sys
child = subprocess.run([sys.executable, "-c", "from numpy._core._multiarray_umath import "
                        "__cpu_features__ as f; print(int(f['AVX512F']), int(f['AVX512VNNI']))"],
                       capture_output=True, text=True, check=True).stdout.split()
print(json.dumps({"numpy": {k: bool(v) for k, v in f.items()}, "exact": int8_kernels_exact(),
                  "child": [bool(int(v)) for v in child]}))
"""

#: each int8 x86 form's scores of the bundle's golden cells: ``forms(path)``, run in this process
#: (the CPU unmasked) or by ``FORMS`` in a masked one
FORMS_CODE = """
import sys, numpy as np
from cyto.bundle import load_bundle
from cyto.runtime import load_scorer
from cyto.runtime.verify import read_golden
def forms(path):
    b = load_bundle(path, weights=False)
    images = read_golden(b).images
    out = {}
    for key in ("int8-cpu", "int8-cpu7"):
        s = load_scorer(b, "onnx", "cpu", "int8", verify=False, graph=b.spec.graphs[key])
        out[key] = s.score(images)
        s.close()
    return out
"""
FORMS = FORMS_CODE + "np.savez(sys.argv[2], **forms(sys.argv[1]))\n"


def _forms_here(bundle) -> dict[str, np.ndarray]:
    """What ``FORMS`` computes, in this process (the CPU unmasked)."""
    space: dict = {}
    exec(FORMS_CODE, space)  # noqa: S102 (the test's own code, as the masked child runs it)
    return space["forms"](str(bundle))


# seconds a masked command may take: emulated (qemu-user), each takes about ten times longer
LONG = 1200 if isa_mask.way() == "qemu" else 300


@pytest.fixture(scope="module")
def mask(tmp_path_factory):
    """The compiled mask of the way chosen here, tried once: a machine that lists cpuid_fault
    (or has qemu-user) but cannot compile or run the mask skips these tests, saying why."""
    try:
        lib = isa_mask.build(tmp_path_factory.mktemp("isa_mask"))
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot compile the CPUID mask here: {getattr(exc, 'stderr', exc)}")
    trial = subprocess.run(
        [sys.executable, "-c", "pass"], env=isa_mask.environ(lib, "avx2"), capture_output=True
    )
    if trial.returncode != 0:
        pytest.skip(f"the CPUID mask cannot run here: {trial.stderr.decode(errors='replace')}")
    return lib


def _python(
    code: str, *args: str, profile: str | None, lib, cwd=None
) -> subprocess.CompletedProcess:
    env = isa_mask.environ(lib, profile) if profile else None
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=LONG if profile else 300,
        cwd=cwd,
    )


def test_the_mask_makes_the_libraries_see_a_cpu_without_vnni(mask, tmp_path):
    native = machine.int8_kernels_exact()
    for profile in isa_mask.profiles():
        proc = _python(SEES, profile=profile, lib=mask)
        assert proc.returncode == 0, proc.stderr
        seen = json.loads(proc.stdout)
        assert seen["numpy"]["AVX2"] and not seen["numpy"]["AVX512VNNI"], (profile, seen)
        if profile == "avx2":
            assert not seen["numpy"]["AVX512F"] and not seen["numpy"]["AVX512BW"]
        # a process it starts sees the same CPU (the mask is armed again after execve)
        assert seen["child"] == [seen["numpy"]["AVX512F"], False], (profile, seen)
        # ONNX Runtime's uint8 x int8 kernels now pair products in int16: they saturate
        assert seen["exact"] is (False if native is not None else None), (profile, seen)
    # a crash is still a crash under the mask (faulting: its SIGSEGV handler passes other faults
    # on; emulated: QEMU delivers the fault and dies of it), in tmp_path for QEMU's core file
    proc = _python("import ctypes; ctypes.string_at(0)", profile="avx2", lib=mask, cwd=tmp_path)
    assert proc.returncode == -signal.SIGSEGV, (proc.returncode, proc.stderr[-500:])
    for name, why in [("sse", "not a profile")] + (
        [("avx512", "cannot be emulated")] if isa_mask.way() == "qemu" else []
    ):
        bad = subprocess.run(
            [sys.executable, "-c", "pass"],
            env={**isa_mask.environ(mask, "avx2"), "ISA_MASK": name},
            capture_output=True,
            text=True,
        )
        assert bad.returncode == 2 and why in bad.stderr, (name, bad.returncode, bad.stderr)


def test_a_bundle_moved_to_a_cpu_without_vnni_scores_with_the_form_made_for_it(
    mask, exported_bundles, synth_patches, tmp_path
):
    if machine.int8_kernels_exact() is None:
        pytest.skip("ONNX Runtime cannot be probed here")
    bundle = tmp_path / "f.cyto"
    shutil.copytree(exported_bundles["fs-sil"], bundle)
    write_golden(bundle, synth_patches, normal="normal", n=64)
    size = load_bundle(bundle, weights=False).spec.crop_size
    calib = load_cells(synth_patches, size, classes="normal", limit=48)
    held = load_cells(synth_patches, size, normal="normal")
    ranges = tmp_path / "ranges"  # one calibration pass for the three forms, as in export
    ranges.mkdir()
    export_variant(bundle, "int8-cpu7", calib, held, echo=lambda m: None, calib_cache=ranges)
    # the 8-bit form as a VNNI machine exports it, and TensorRT's (kept even below the gate)
    for key in ("int8-cpu", "int8"):
        export_variant(
            bundle, key, calib, held, accept_loss=True, echo=lambda m: None, calib_cache=ranges
        )

    # the same graphs on this CPU (in this process: no mask) and on the masked ones (AVX2;
    # AVX-512 without VNNI), each in a process of its own
    scores = {None: _forms_here(bundle)}
    for profile in isa_mask.profiles():
        out = tmp_path / f"forms-{profile}.npz"
        proc = _python(FORMS, str(bundle), str(out), profile=profile, lib=mask)
        assert proc.returncode == 0, proc.stderr[-2000:]
        with np.load(out) as z:
            scores[profile] = {k: z[k] for k in z.files}
    for profile in isa_mask.profiles():
        # 7-bit weights: pairs of products stay below 2^15, so every x86 CPU's kernels give
        # this CPU's numbers
        np.testing.assert_allclose(
            scores[profile]["int8-cpu7"], scores[None]["int8-cpu7"], rtol=1e-5, atol=1e-6
        )
        if machine.int8_kernels_exact():  # a VNNI CPU: its 8-bit numbers are not the others'
            other = scores[profile]["int8-cpu"]
            assert not np.allclose(other, scores[None]["int8-cpu"], atol=1e-4), profile

    # cyto predict on the masked CPU: the 7-bit form, chosen by measuring the kernels (the
    # flags in /proc/cpuinfo are still this host's), verified there, and said; OpenVINO,
    # first in cpu_order(), tries TensorRT's form and the 8-bit one first, which fail there
    env = {
        k: v
        for k, v in isa_mask.environ(mask, "avx2").items()
        if k == "LD_PRELOAD" or k.startswith("ISA_MASK")
    }
    proc = run_cyto(
        "predict", str(bundle), "--data", str(synth_patches), "--normal", "normal",
        "--precision", "int8", "--out", str(tmp_path / "p.parquet"), env=env, timeout=LONG,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "encoder-int8-cpu7.onnx" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    records = [json.loads(p.read_text()) for p in (bundle / "verified").glob("*.json")]
    masked = [r for r in records if r["machine"]["int8_exact"] is False]
    passed = [r["key"]["artifact"]["graph"] for r in masked if r["passed"]]
    assert passed == ["encoder-int8-cpu7.onnx"], masked

    # cyto doctor there: every form run on the golden cells; the 7-bit one passes and is what
    # auto takes, the others fail with their numbers and say why
    proc = run_cyto("doctor", str(bundle), "--device", "cpu", env=env, timeout=LONG)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "8-bit weights would saturate in int16 here" in out, out
    # said masked where the host's flags say VNNI; an AVX2-only host is what it is
    assert ("masked CPU" in out) == bool(machine.cpu_info().int8_dot), out
    rows = {  # (backend, graph): status
        (ln.split()[1], ln.split()[-1]): ln.split()[3]
        for ln in out.splitlines()
        if ln.strip().startswith("cpu ")
    }
    sevens = {status for (_, graph), status in rows.items() if graph == "encoder-int8-cpu7.onnx"}
    assert sevens == {"passed"}, out  # through every backend
    first = "openvino" if ("openvino", "encoder-int8-cpu7.onnx") in rows else "onnx"
    # "(passed)", or "(passed, from the record of DATE)" where a row above verified it now
    assert f"{first} on cpu (int8, encoder-int8-cpu7.onnx) (passed" in out, out
    if "FAILED" in (rows[("onnx", "encoder-int8.onnx")], rows[(first, "encoder-int8.onnx")]):
        # TensorRT's form through AVX2's int8 kernels
        assert "TensorRT's form, for GPUs (a CPU takes the bundle's x86 forms)" in out, out
    if rows[("onnx", "encoder-int8-cpu.onnx")] == "FAILED":  # saturated in int16 pairs
        assert "the 8-bit x86 form, for CPUs whose int8 kernels sum exactly" in out, out
    assert set(rows.values()) >= {"passed", "FAILED"}, out  # this fixture saturates on AVX2


EXPORT_INT8 = """
import json, sys, tempfile
from pathlib import Path
from cyto.bundle import load_bundle
from cyto.export.quantize import export_variant, load_cells
path, data = sys.argv[1], sys.argv[2]
size = load_bundle(path, weights=False).spec.crop_size
calib = load_cells(data, size, classes="normal", limit=48)
held = load_cells(data, size, normal="normal")
out = {}
with tempfile.TemporaryDirectory() as ranges:
    for key in ("int8-cpu", "int8-cpu7", "int8"):
        entry = export_variant(
            path, key, calib, held, accept_loss=True, echo=lambda m: None, calib_cache=Path(ranges)
        )
        out[key] = {"gate": entry["parity_vs_fp32"], "here": entry.get("parity_here")}
print(json.dumps(out))
"""


def test_the_export_gate_of_every_int8_form_is_the_same_on_every_x86_cpu(
    mask, exported_bundles, synth_patches, tmp_path
):
    """An int8 graph is exported on one machine for others, and judged by the numbers it
    scores with there, not by whether the exporting CPU's int8 kernels saturate: TensorRT's form
    (a GPU sums in int32) and the 7-bit x86 form (the same kernels' numbers on every x86 CPU)
    exactly alike; the 8-bit x86 form, which needs VNNI, by its unfused Q/DQ numbers on a CPU
    without it, with this CPU's saturated ranking recorded beside it. (An AVX2 workstation
    refused TensorRT's form at Spearman 0.53 where a VNNI CPU measures 0.9997.)"""
    from cyto.runtime.verify import passes

    if machine.int8_kernels_exact() is None:
        pytest.skip("ONNX Runtime cannot be probed here")
    got = {}
    for profile in (None, "avx2"):
        bundle = tmp_path / f"{profile}.cyto"
        shutil.copytree(exported_bundles["fs-sil"], bundle)
        proc = _python(EXPORT_INT8, str(bundle), str(synth_patches), profile=profile, lib=mask)
        assert proc.returncode == 0, proc.stderr[-2000:]
        got[profile] = json.loads(proc.stdout.strip().splitlines()[-1])
    exact_here = machine.int8_kernels_exact()
    for key in ("int8", "int8-cpu7") if exact_here else ("int8", "int8-cpu", "int8-cpu7"):
        here, avx2 = got[None][key]["gate"], got["avx2"][key]["gate"]
        assert abs(here["spearman"] - avx2["spearman"]) < 1e-3, (key, here, avx2)
        assert here["top10_overlap"] == avx2["top10_overlap"], (key, here, avx2)
        assert avx2["max_abs_diff"] == pytest.approx(here["max_abs_diff"], rel=0.02, abs=1e-6)
    # the 8-bit form: VNNI's exact sums here, its unfused numbers as an AVX2 CPU (rounded
    # otherwise), the same verdict; AVX2's own kernels saturate, recorded beside the gate
    here, avx2 = got[None]["int8-cpu"], got["avx2"]["int8-cpu"]
    assert abs(here["gate"]["spearman"] - avx2["gate"]["spearman"]) < 0.01, (here, avx2)
    assert passes(here["gate"]) == passes(avx2["gate"]), (here, avx2)
    assert avx2["here"]["spearman"] < avx2["gate"]["spearman"] - 0.01, avx2
    assert got[None]["int8"]["here"] is None  # TensorRT's form does not run on this CPU
