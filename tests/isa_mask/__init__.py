"""Run a command as on an x86 CPU without AVX-512/VNNI/AMX: natively where the CPU can trap CPUID,
else under QEMU's emulation of an AVX2 CPU.

ONNX Runtime, PyTorch's oneDNN, OpenVINO, numpy and numba choose their kernels by CPUID, so the
numbers an int8 graph computes depend on the CPU it runs on. Two ways make a process, and every
process it starts, see another CPU; both are a library loaded with ``LD_PRELOAD`` (so a caller
needs only :func:`environ`), and :func:`way` picks one:

- ``cpuid-fault`` (``isa_mask.c``), where ``/proc/cpuinfo`` lists ``cpuid_fault``: every CPUID
  traps (the kernel's CPUID faulting) and the profile's feature bits are cleared; the libraries
  pick the kernels an AVX2-only CPU (``avx2``) or an AVX-512 CPU without VNNI (``avx512``) would
  run, at native speed.
- ``qemu`` (``isa_emulate.c``), elsewhere, where ``qemu-x86_64`` (Debian's ``qemu-user``, 7.2 or
  later) is installed: the process executes itself again under ``qemu-x86_64 -cpu max``, whose
  TCG implements AVX2, FMA and F16C but no AVX-512, so the libraries run AVX2's kernels and compute
  exactly their numbers (VPMADDUBSW's int16 saturation included), about ten times slower; timings
  there mean nothing. Only the ``avx2`` profile. In the test suite it is opt-in, because the
  masked tests take minutes emulated: set ``CYTO_ISA_EMULATE=1``. ``python -m tests.isa_mask``
  uses it whenever faulting is absent.

``/proc/cpuinfo`` still shows the host's flags either way. A static or setuid program ignores
``LD_PRELOAD`` and runs as the host.

    python -m tests.isa_mask avx2 -- make test
    python -m tests.isa_mask avx2 -- python benchmarks/speed/int8_machine.py ...
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PROFILES = ("avx2", "avx512")
SOURCES = {
    "cpuid-fault": Path(__file__).with_name("isa_mask.c"),
    "qemu": Path(__file__).with_name("isa_emulate.c"),
}
WAY_PROFILES = {"cpuid-fault": PROFILES, "qemu": ("avx2",)}
EMULATE_ENV = "CYTO_ISA_EMULATE"  # "1": the test suite may emulate where faulting is absent
QEMU = "qemu-x86_64"
QEMU_CPU = "max"  # everything QEMU's TCG implements: AVX2, FMA, F16C; no AVX-512


def _way(emulate: bool | None) -> tuple[str | None, str]:
    here = f"{platform.system()} {platform.machine()}"
    if here not in ("Linux x86_64", "Linux AMD64"):
        return None, f"CPUID masking needs Linux on x86-64 (this is {here})"
    if shutil.which("cc") is None:
        return None, "CPUID masking needs a C compiler (cc)"
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError as exc:
        return None, f"cannot read /proc/cpuinfo ({exc})"
    if " cpuid_fault" in flags:
        return "cpuid-fault", ""
    no_fault = "this CPU or hypervisor has no CPUID faulting (no cpuid_fault in /proc/cpuinfo)"
    if emulate is None:
        emulate = os.environ.get(EMULATE_ENV) == "1"
    if shutil.which(QEMU) is None:
        return None, f"{no_fault}, and {QEMU} (qemu-user) is not installed to emulate one"
    if not emulate:
        return None, (
            f"{no_fault}; {EMULATE_ENV}=1 runs these tests under {QEMU} instead (minutes)"
        )
    return "qemu", ""


def way(emulate: bool | None = None) -> str | None:
    """``cpuid-fault``, ``qemu`` or None (see :func:`why_unavailable`). ``emulate``: whether
    emulation may be used (default: ``CYTO_ISA_EMULATE=1`` in the environment)."""
    return _way(emulate)[0]


def why_unavailable(emulate: bool | None = None) -> str | None:
    """None where some way of masking can work here, else why not (in words)."""
    found, why = _way(emulate)
    return None if found else why


def profiles(emulate: bool | None = None) -> tuple[str, ...]:
    """The profiles the way chosen here can run (none where there is none)."""
    found = way(emulate)
    return WAY_PROFILES[found] if found else ()


def build(folder: Path, emulate: bool | None = None) -> Path:
    """Compile the library of the way chosen here into ``folder``; its path (the name holds
    ``isa_mask``, by which :func:`cyto.bench.device.cpuid_mask` knows a masked process)."""
    found, why = _way(emulate)
    if found is None:
        raise RuntimeError(why)
    lib = Path(folder) / ("isa_mask.so" if found == "cpuid-fault" else "isa_mask-qemu.so")
    subprocess.run(
        ["cc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(SOURCES[found]), "-ldl"],
        check=True,
        capture_output=True,
    )
    return lib


def environ(lib: Path, profile: str, base: dict | None = None) -> dict:
    """``base`` (this process's environment) with ``lib`` (from :func:`build`) preloaded for
    ``profile``: a process started with it, and each of its children, sees that CPU."""
    if profile not in PROFILES:
        raise ValueError(f"{profile!r} is not one of {PROFILES}")
    env = dict(os.environ if base is None else base)
    preload = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = f"{lib}{':' + preload if preload else ''}"
    env["ISA_MASK"] = profile
    if Path(lib).name == "isa_mask-qemu.so":
        env["ISA_MASK_QEMU"] = shutil.which(QEMU) or QEMU
        env.setdefault("ISA_MASK_QEMU_CPU", QEMU_CPU)
        env.pop("ISA_MASK_GUEST", None)
    return env


def main(argv: list[str]) -> int:
    usage = f"usage: python -m tests.isa_mask {{{','.join(PROFILES)}}} -- COMMAND..."
    if len(argv) < 3 or argv[0] not in PROFILES or argv[1] != "--":
        print(usage, file=sys.stderr)
        return 2
    found, why = _way(emulate=True)
    if found is None:
        print(f"isa_mask: {why}", file=sys.stderr)
        return 2
    if argv[0] not in WAY_PROFILES[found]:
        print(f"isa_mask: {found} cannot give the {argv[0]} profile (only avx2)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="isa_mask-") as tmp:
        env = environ(build(Path(tmp), emulate=True), argv[0])
        command = " ".join(argv[2:])
        if found == "cpuid-fault":
            print(
                f"isa_mask: running as an {argv[0]} CPU (CPUID faulting): {command}",
                file=sys.stderr,
            )
        else:
            print(
                f"isa_mask: running as an {argv[0]} CPU, emulated by {env['ISA_MASK_QEMU']} "
                f"-cpu {env['ISA_MASK_QEMU_CPU']} (the numbers are the AVX2 kernels'; timings "
                f"are meaningless, ~10x slower): {command}",
                file=sys.stderr,
            )
        return subprocess.call(argv[2:], env=env)
