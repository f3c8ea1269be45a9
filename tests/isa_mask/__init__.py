"""Run a command as on an x86 CPU without AVX-512/VNNI/AMX, at native speed (``isa_mask.c``).

ONNX Runtime, PyTorch's oneDNN, numpy and numba choose their kernels by CPUID, so the numbers an
int8 graph computes depend on the CPU it runs on. ``isa_mask.c``, loaded with ``LD_PRELOAD``,
traps every CPUID (the kernel's CPUID faulting) and clears the profile's feature bits; the
libraries then pick the kernels an AVX2-only CPU (``avx2``) or an AVX-512 CPU without VNNI
(``avx512``) would run. ``/proc/cpuinfo`` still shows the host's flags.

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
SOURCE = Path(__file__).with_name("isa_mask.c")


def why_unavailable() -> str | None:
    """None where masking can work here, else why not (in words)."""
    here = f"{platform.system()} {platform.machine()}"
    if here not in ("Linux x86_64", "Linux AMD64"):
        return f"CPUID masking needs Linux on x86-64 (this is {here})"
    if shutil.which("cc") is None:
        return "CPUID masking needs a C compiler (cc)"
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError as exc:
        return f"cannot read /proc/cpuinfo ({exc})"
    if " cpuid_fault" not in flags:
        return "this CPU or hypervisor has no CPUID faulting (no cpuid_fault in /proc/cpuinfo)"
    return None


def build(folder: Path) -> Path:
    """Compile ``isa_mask.c`` into ``folder``; the shared library's path."""
    lib = Path(folder) / "isa_mask.so"
    subprocess.run(
        ["cc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(SOURCE), "-ldl"],
        check=True,
        capture_output=True,
    )
    return lib


def environ(lib: Path, profile: str, base: dict | None = None) -> dict:
    """``base`` (this process's environment) with the mask of ``profile`` preloaded."""
    if profile not in PROFILES:
        raise ValueError(f"{profile!r} is not one of {PROFILES}")
    env = dict(os.environ if base is None else base)
    preload = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = f"{lib}{':' + preload if preload else ''}"
    env["ISA_MASK"] = profile
    return env


def main(argv: list[str]) -> int:
    usage = f"usage: python -m tests.isa_mask {{{','.join(PROFILES)}}} -- COMMAND..."
    if len(argv) < 3 or argv[0] not in PROFILES or argv[1] != "--":
        print(usage, file=sys.stderr)
        return 2
    why = why_unavailable()
    if why:
        print(f"isa_mask: {why}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="isa_mask-") as tmp:
        env = environ(build(Path(tmp)), argv[0])
        print(f"isa_mask: running as an {argv[0]} CPU: {' '.join(argv[2:])}", file=sys.stderr)
        return subprocess.call(argv[2:], env=env)
