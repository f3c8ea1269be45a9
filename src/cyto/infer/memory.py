"""Process memory as Linux reports it (resident and peak resident set)."""

from __future__ import annotations

import resource
from pathlib import Path


def proc_status_mb(field: str) -> float | None:
    """A memory field of /proc/self/status (``VmRSS``, ``VmHWM``) in MB; None off Linux."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def peak_rss_mb() -> float:
    """This process's peak resident memory in MB: VmHWM, which starts afresh in a spawned
    worker (``ru_maxrss`` would carry over the parent's peak across exec on Linux)."""
    hwm = proc_status_mb("VmHWM")
    if hwm is not None:
        return hwm
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
