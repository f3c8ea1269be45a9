"""Pack an onnxruntime-gpu wheel small enough to carry to a lent GPU machine (64 MiB a call).

The wheel's CUDA provider holds GPU code for seven architectures (onnxruntime-gpu 1.31.1: 284 MB,
sm_75 to sm_120). Every fatbin entry for another architecture than ``--sm`` is zeroed in place
(headers, sizes and ELF layout unchanged; the CUDA runtime never loads an entry of another
architecture), the package is tarred with xz, and split into ``--parts`` files to send one per
call; the command on the machine joins them (``cat``), checks the sha256 and untars them.
onnxruntime-gpu 1.31.1 for sm_90 (H100/H200): 255 MB wheel -> 58 MiB in two parts.

    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \\
        --platform manylinux_2_28_x86_64 -d WHEELS onnxruntime-gpu==1.31.1
    python benchmarks/gpu/ort_gpu_pack.py WHEELS/onnxruntime_gpu-*.whl --sm 90 --out DIR
"""

from __future__ import annotations

import argparse
import hashlib
import lzma
import mmap
import struct
import tarfile
import tempfile
import zipfile
from pathlib import Path

MAGIC = b"\x50\xed\x55\xba"  # a fatbin's header (little-endian 0xBA55ED50)


def zero_other_architectures(path: Path, keep: int) -> int:
    """Zero the payload of every fatbin entry in ``path`` built for another SM than ``keep``;
    returns the bytes zeroed."""
    zeroed = 0
    with path.open("r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        pos = 0
        while (i := m.find(MAGIC, pos)) >= 0:
            _version, header, size = struct.unpack_from("<HHQ", m, i + 4)
            if header != 16 or size == 0 or i + header + size > len(m):
                pos = i + 4  # the magic bytes inside other data
                continue
            entry, end = i + header, i + header + size
            while entry < end:
                _kind, _, entry_header, payload = struct.unpack_from("<HHIQ", m, entry)
                (sm,) = struct.unpack_from("<I", m, entry + 28)
                if sm != keep:
                    start = entry + entry_header
                    m[start : start + payload] = bytes(payload)
                    zeroed += payload
                entry += entry_header + payload
            pos = end
        m.flush()
    return zeroed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("wheel", type=Path)
    ap.add_argument("--sm", type=int, default=90, help="GPU architecture kept (90: H100/H200)")
    ap.add_argument("--parts", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "pkg"
        with zipfile.ZipFile(a.wheel) as z:
            z.extractall(root)
        capi = root / "onnxruntime" / "capi"
        # the Python module links the runtime statically; this copy is for C API users
        for lib in capi.glob("libonnxruntime.so.*"):
            lib.unlink()
        zeroed = sum(zero_other_architectures(p, a.sm) for p in capi.glob("*providers_cuda*"))
        packed = Path(tmp) / "ort.tar.xz"
        with lzma.open(packed, "wb", preset=9) as xz, tarfile.open(fileobj=xz, mode="w") as t:
            for item in sorted(root.iterdir()):
                t.add(item, arcname=item.name)
        data = packed.read_bytes()
    step = -(-len(data) // a.parts)
    for k in range(a.parts):
        (a.out / f"ort.{k:02d}").write_bytes(data[k * step : (k + 1) * step])
    (a.out / "ort.sha256").write_text(hashlib.sha256(data).hexdigest() + "\n")
    print(
        f"zeroed {zeroed / 2**20:.0f} MiB of other GPU architectures; {len(data) / 2**20:.1f} "
        f"MiB in {a.parts} parts under {a.out}"
    )


if __name__ == "__main__":
    main()
