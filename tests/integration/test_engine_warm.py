"""A scorer whose verification comes from the cache has run nothing yet: load_scorer warms it
(one blank cell through the backend and the head) so that a slide's first batch does not pay
for numba's start and the backend's set-up and count them as engine time."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from cyto.export.golden import write_golden
from cyto.runtime import load_scorer

FRESH = """
import json, sys
from cyto.runtime import load_scorer
from cyto.runtime.heads.softmax import softmax_abnormal
scorer = load_scorer(sys.argv[1], "onnx", "cpu", "fp32", verify=sys.argv[2] == "verify")
v = scorer.verification
print(json.dumps({"cached": v.cached, "status": v.status,
                  "kernels": len(softmax_abnormal.signatures)}))
"""


def _fresh_process(bundle, how: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", FRESH, str(bundle), how],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("how", ["verify", "skip"])
def test_a_scorer_verified_from_the_cache_is_warm_before_the_first_batch(
    exported_bundles, synth_patches, tmp_path, how
):
    bundle = tmp_path / "f.cyto"  # a softmax head: its finish is a numba kernel
    shutil.copytree(exported_bundles["fs-sil"], bundle)
    write_golden(bundle, synth_patches, normal="normal", n=16)
    load_scorer(bundle, "onnx", "cpu", "fp32").close()  # verified here once, and cached
    seen = _fresh_process(bundle, how)
    if how == "verify":
        assert seen["cached"] and seen["status"] == "passed", seen
    else:
        assert seen["status"] == "skipped", seen
    # the head's kernel was loaded by load_scorer, not left for the slide's first batch
    assert seen["kernels"] >= 1, seen
