"""The engine lane: batches of crops through the scorer, in order, with the engine kept busy.

``overlap`` runs every scorer call in one background thread, so the caller assembles the next
batch (decodes, detects and crops the next tiles) while the engine scores this one. At most
``depth`` batches are submitted and not yet taken back (double buffering at the default 2): what
waits for the engine is bounded. Without ``overlap`` a batch is scored when it is submitted.

On a CUDA device the lane has a stream of its own. A batch that is a tensor on the device was
written on the caller's stream: the lane's stream waits for an event recorded there, and the
tensor is marked as used on the lane's stream, so the caching allocator does not hand its memory
out while the engine reads it. The engine's device time (``device_s``), from which ``cyto bench
slide`` reports the GPU's busy fraction, comes from CUDA events on the stream the work runs on:
the lane's for PyTorch, the backend's own clock where it runs on a stream of its own (TensorRT).

PyTorch is imported only when a batch is a tensor or the device is CUDA.
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from cyto.errors import ConfigError


class EngineLane:
    def __init__(self, scorer, batch_size: int, overlap: bool = False, depth: int = 2) -> None:
        if depth < 1:
            raise ConfigError(f"the engine lane needs depth >= 1, got {depth}")
        self.scorer, self.batch_size, self.depth = scorer, batch_size, depth
        self.wall_s = 0.0  # seconds spent in scorer calls (in the lane's thread when overlapping)
        self.device_s = 0.0  # CUDA event time of the scorer calls (0 off CUDA)
        self.calls = 0
        self.cuda = str(scorer.device).startswith("cuda")
        self._stream = None
        if self.cuda:
            import torch

            self._stream = torch.cuda.Stream(device=torch.device(scorer.device))
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="cyto-engine") if overlap else None
        self._out: deque = deque()  # (future, tag), in submission order

    @property
    def overlap(self) -> bool:
        return self._pool is not None

    def __len__(self) -> int:
        return len(self._out)

    def submit(self, crops, tag=None) -> list[tuple[np.ndarray, object]]:
        """Queue a batch (a uint8 (N, H, W, 3) array or tensor) with ``tag``; returns the
        ``(scores, tag)`` of the batches that had to finish to keep at most ``depth`` out."""
        done = []
        while len(self._out) >= self.depth:
            done.append(self._take())
        ready = None
        if self.cuda and not isinstance(crops, np.ndarray):
            import torch

            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(crops.device))  # the crops are complete here
        if self._pool is not None:
            future = self._pool.submit(self._run, crops, ready)
        else:
            future = Future()
            try:
                future.set_result(self._run(crops, ready))
            except BaseException as exc:  # noqa: BLE001 (re-raised where the result is taken)
                future.set_exception(exc)
        self._out.append((future, tag))
        return done

    def drain(self) -> list[tuple[np.ndarray, object]]:
        """Wait for every batch out; their ``(scores, tag)`` in submission order."""
        return [self._take() for _ in range(len(self._out))]

    def _take(self) -> tuple[np.ndarray, object]:
        future, tag = self._out.popleft()
        return future.result(), tag

    def _run(self, crops, ready) -> np.ndarray:
        t0 = time.perf_counter()
        backend = getattr(self.scorer, "backend", None)
        own_clock = self._stream is not None and getattr(backend, "device_s", None) is not None
        if self._stream is None:
            scores = self._score(crops)
        elif own_clock:
            # the backend runs on a stream of its own (TensorRT): its events time the engine;
            # events on the lane's idle stream would only time the host
            import torch

            before = backend.device_s
            with torch.cuda.stream(self._stream):
                if ready is not None:
                    self._stream.wait_event(ready)
                    crops.record_stream(self._stream)
                scores = self._score(crops)
            self.device_s += backend.device_s - before
        else:
            import torch

            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(self._stream):
                if ready is not None:
                    self._stream.wait_event(ready)
                    crops.record_stream(self._stream)
                start.record()
                scores = self._score(crops)  # ends in a copy of the scores to the host
                end.record()
            end.synchronize()
            self.device_s += start.elapsed_time(end) / 1000.0
        self.wall_s += time.perf_counter() - t0
        self.calls += 1
        return scores

    def _score(self, crops) -> np.ndarray:
        if isinstance(crops, np.ndarray):
            return self.scorer.score(crops, self.batch_size)
        return self.scorer.score_tensor(crops, self.batch_size)

    def close(self) -> None:
        """Stop: batches not started are dropped, the running one is waited for."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._out.clear()
