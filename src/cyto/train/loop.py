"""The one training loop: device, mixed precision, seeds, progress, checkpoints, resume, NaN guard.

Every method calls :func:`run_phase` with its own loss; nothing else about training is written
twice. A phase checkpoints after every epoch (modules, optimizer, scheduler, loss history) into
the run's checkpoint folder; ``resume=True`` continues after the last finished epoch. Data order and
augmentations are seeded by (seed, epoch), so a resumed run repeats the uninterrupted one exactly.
"""

from __future__ import annotations

import io
import math
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from torch import nn

from cyto.errors import DeviceError, TrainingError
from cyto.flags import passing, setting
from cyto.progress import progress

DEVICES = ("auto", "cpu", "cuda")


def resolve_device(name: str = "auto") -> torch.device:
    """``auto`` picks CUDA when present; CUDA asked for but absent is an error, not a fallback."""
    if name not in DEVICES and not name.startswith("cuda:"):
        raise DeviceError(f"unknown device {name!r}; use one of {', '.join(DEVICES)}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise DeviceError(
            f"device {name!r} was asked for but CUDA is not available here (no NVIDIA GPU or "
            f"driver, or a CPU-only torch build); use {passing('device', 'cpu')}"
        )
    return torch.device(name)


def seed_everything(seed: int) -> None:
    """Seed torch for one run or epoch (called by the loop, never at import)."""
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def set_deterministic(on: bool = True) -> None:
    """Deterministic kernels (the 'oral' recipe asks for it); slower on GPU."""
    torch.use_deterministic_algorithms(on, warn_only=True)
    if torch.backends.cudnn.is_available():
        torch.backends.cudnn.benchmark = not on
        torch.backends.cudnn.deterministic = on
    if on:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def _checkpoint_path(ckpt_dir: Path | None, phase: str) -> Path | None:
    return None if ckpt_dir is None else Path(ckpt_dir) / f"{phase}.pt"


def run_phase(
    phase: str,
    modules: dict[str, nn.Module],
    optimizer: torch.optim.Optimizer,
    epochs: int,
    batches: Callable[[int], Iterable[tuple[torch.Tensor, ...]]],
    loss_fn: Callable[..., torch.Tensor],
    n_batches: int,
    device: torch.device,
    seed: int,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    ckpt_dir: Path | None = None,
    resume: bool = False,
    amp: bool = True,
    on_epoch_end: Callable[[int], None] | None = None,
) -> list[float]:
    """Train ``modules`` for ``epochs``; returns the mean loss of every epoch.

    Args:
        phase: name of the phase (checkpoint file name, progress label).
        modules: the networks trained (and checkpointed) here, already on ``device``.
        batches: ``batches(epoch)`` yields tuples of CPU tensors, seeded by the epoch.
        loss_fn: ``loss_fn(*batch_on_device)`` returns a scalar loss.
        n_batches: batches per epoch (for the progress bar).
        on_epoch_end: called after each epoch, before its checkpoint (e.g. refit a
            pseudo-labeller); state it changes must live in ``modules`` to survive a resume.
    """
    ckpt = _checkpoint_path(ckpt_dir, phase)
    history: list[float] = []
    start = 0
    if ckpt is not None and ckpt.exists():
        if not resume:
            ckpt.unlink()
        else:
            state = torch.load(ckpt, map_location=device, weights_only=True)
            for name, mod in modules.items():
                mod.load_state_dict(state["modules"][name])
            optimizer.load_state_dict(state["optimizer"])
            if scheduler is not None and state.get("scheduler") is not None:
                scheduler.load_state_dict(state["scheduler"])
            history = list(state["history"])
            start = int(state["epoch"]) + 1
    use_amp = amp and device.type == "cuda"
    scaler = torch.amp.GradScaler("cuda") if use_amp else None
    channels_last = device.type == "cuda"
    if channels_last:
        for mod in modules.values():
            mod.to(memory_format=torch.channels_last)

    with progress(phase, total=(epochs - start) * n_batches, unit="batches") as bar:
        for epoch in range(start, epochs):
            seed_everything(seed * 100003 + epoch)
            for mod in modules.values():
                mod.train()
            total, count, t0, seen = 0.0, 0, time.perf_counter(), 0
            for batch in batches(epoch):
                batch = tuple(
                    b.to(device, non_blocking=True, memory_format=torch.channels_last)
                    if channels_last and b.ndim == 4
                    else b.to(device, non_blocking=True)
                    for b in batch
                )
                optimizer.zero_grad(set_to_none=True)
                with torch.autocast(device.type, dtype=torch.float16, enabled=use_amp):
                    loss = loss_fn(*batch)
                value = float(loss.detach())
                if not math.isfinite(value):
                    raise TrainingError(
                        f"{phase}: the loss became {value} at epoch {epoch + 1}, batch {count + 1};"
                        f" lower the learning rate ({setting('lr', '...')}) or check the input "
                        "images"
                    )
                if scaler is not None:
                    scaler.scale(loss).backward()
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    loss.backward()
                    optimizer.step()
                total += value
                count += 1
                seen += int(batch[0].shape[0])
                rate = seen / max(time.perf_counter() - t0, 1e-9)
                bar.set_postfix(
                    f"epoch {epoch + 1}/{epochs} loss {total / count:.4g} {rate:,.0f} img/s"
                )
                bar.advance()
            if scheduler is not None:
                scheduler.step()
            history.append(total / max(count, 1))
            if on_epoch_end is not None:
                on_epoch_end(epoch)
            if ckpt is not None:
                save_checkpoint(ckpt, modules, optimizer, scheduler, epoch, history)
    return history


def save_checkpoint(path, modules, optimizer, scheduler, epoch, history) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        "modules": {k: m.state_dict() for k, m in modules.items()},
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "epoch": epoch,
        "history": history,
    }
    # serialized in memory, then written as any file is (atomic_write): torch.save onto a full
    # disk raised its own RuntimeError ("unexpected pos") in a 60-line traceback and left the
    # half-written file (hostile round 47, 2); a write's OSError is the machine's, one line
    from cyto.bundle import atomic_write

    buffer = io.BytesIO()
    torch.save(state, buffer)
    try:
        atomic_write(path, buffer.getvalue())
    except OSError as exc:
        if exc.filename is None:  # a write on an open file names none: the checkpoint's
            exc.filename = str(path)
        raise
