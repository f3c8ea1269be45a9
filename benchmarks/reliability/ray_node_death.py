"""A whole Ray node killed mid-cohort (issue 19): the cohort still completes on the other node and
every score table equals a plain run's.

A head and a second node are started with `ray start` on this machine; once both engines hold a
slide and a chunk is on disk, the second node's process group (raylet, engine) gets SIGKILL.

    python benchmarks/reliability/ray_node_death.py MODEL SLIDE... --work DIR
"""

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq

from cyto.cohort import score_cohort
from cyto.cohort.ray import score_cohort_ray
from cyto.infer import ScoreOptions

ap = argparse.ArgumentParser()
ap.add_argument("model", type=Path)
ap.add_argument("slides", type=Path, nargs="+")
ap.add_argument("--work", type=Path, required=True)
args = ap.parse_args()
# a node joining the cluster sends its token (~/.ray/auth_token) only in this mode
env = {**os.environ, "RAY_AUTH_MODE": "token"}

ray_bin = str(Path(sys.executable).with_name("ray"))
s = socket.socket()
s.bind(("127.0.0.1", 0))
port = s.getsockname()[1]
s.close()
common = ["--num-cpus", "1", "--block", "--disable-usage-stats", "--node-ip-address", "127.0.0.1"]
head = subprocess.Popen(
    [ray_bin, "start", "--head", "--port", str(port), "--include-dashboard", "false", *common],
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
    start_new_session=True,
    env=env,
)
time.sleep(8)
node = subprocess.Popen(
    [ray_bin, "start", "--address", f"127.0.0.1:{port}", *common],
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
    start_new_session=True,
    env=env,
)
time.sleep(8)
slides = args.slides
opts = ScoreOptions(mosaic=0, workers=0, tile=512, chunk_cells=4)
out = args.work / "ray"
shutil.rmtree(out, ignore_errors=True)
plain = args.work / "plain"
shutil.rmtree(plain, ignore_errors=True)
score_cohort(slides, args.model, plain, opts, echo=lambda m: None)
said = []


def killer():
    # once both engines are busy, kill the second node's whole process group (raylet, workers)
    while True:
        locks = list(out.glob("*/.lock"))
        chunks = list(out.glob("*/.partial/chunk-*.parquet"))
        if len(locks) >= 2 and chunks:
            os.killpg(node.pid, signal.SIGKILL)
            said.append(f"KILLED node pgid {node.pid} at {time.time()}")
            return
        time.sleep(0.02)


threading.Thread(target=killer, daemon=True).start()
t0 = time.time()
done, failed = score_cohort_ray(
    slides, args.model, out, opts, f"127.0.0.1:{port}", said.append, split_tiles=None
)
print(f"{time.time() - t0:.1f} s; done {len(done)} failed {failed}")
for m in said:
    print("  ", m[:200])
for sl in slides:
    same = pq.read_table(plain / sl.stem / "scores.parquet").equals(
        pq.read_table(out / sl.stem / "scores.parquet")
    )
    print(f"{sl.name}: table equals the plain run's: {same}")
print((out / "cohort.csv").read_text())
os.killpg(head.pid, signal.SIGTERM)
head.wait(30)
