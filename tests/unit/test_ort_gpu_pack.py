"""benchmarks/gpu/ort_gpu_pack.py zeroes the GPU code of other architectures and nothing else."""

from __future__ import annotations

import importlib.util
import struct
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "ort_gpu_pack.py"


def _pack_module():
    spec = importlib.util.spec_from_file_location("ort_gpu_pack", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _entry(sm: int, payload: bytes) -> bytes:
    # kind, _, header size (64), payload size, then the SM at byte 28 of the header
    header = struct.pack("<HHIQ", 2, 0, 64, len(payload)) + bytes(12)
    header += struct.pack("<I", sm) + bytes(64 - 32)
    return header + payload


def test_only_other_architectures_are_zeroed(tmp_path):
    pack = _pack_module()
    entries = _entry(80, b"\x11" * 40) + _entry(90, b"\x22" * 24) + _entry(120, b"\x33" * 8)
    fatbin = pack.MAGIC + struct.pack("<HHQ", 1, 16, len(entries)) + entries
    noise = b"\x50\xed\x55\xba" + b"\xff" * 12  # the magic bytes inside other data
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"ELF-code" + noise + fatbin + b"tail")
    before = lib.read_bytes()
    assert pack.zero_other_architectures(lib, 90) == 48
    after = lib.read_bytes()
    assert len(after) == len(before)
    assert after.count(b"\x22" * 24) == 1  # sm_90 kept
    assert b"\x11" not in after and b"\x33" not in after
    assert after.startswith(b"ELF-code" + noise) and after.endswith(b"tail")
    # headers untouched: only payload bytes changed
    changed = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
    assert len(changed) == 48
