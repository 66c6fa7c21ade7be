"""CPU threads for torch: as many as there are cores free for this process.

torch's default, one thread per core present, is the fastest choice on an idle machine and the slowest on a
busy one: OpenMP threads spin-wait for each other, so a thread whose core is taken by another process stalls
the whole step. `choose_threads` counts the cores this process may run on (its affinity mask) less the share
of them other processes keep busy, sampled from /proc/stat.
"""

from __future__ import annotations

import os
import time

import torch

from eaglespec.errors import EagleSpecError


def _allowed_cpus() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return set(range(os.cpu_count() or 1))


def _cpu_times() -> dict[int, tuple[int, int]]:
    """Per core: (idle jiffies, total jiffies) since boot, from /proc/stat ({} where it cannot be read)."""
    out: dict[int, tuple[int, int]] = {}
    try:
        with open("/proc/stat") as f:
            lines = f.readlines()
    except OSError:
        return out
    for line in lines:
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu" or not name[3:].isdigit():
            continue
        # user nice system idle iowait irq softirq steal (guest time is already inside user)
        v = [int(x) for x in fields[:8]]
        out[int(name[3:])] = (v[3] + v[4], sum(v))
    return out


def busy_cores(interval: float = 0.05) -> float:
    """How many of this process's allowed cores other processes kept busy over `interval` seconds (0.0 when
    /proc/stat is not available). This process's own CPU time over the interval is not counted."""
    allowed = _allowed_cpus()
    before, own0, t0 = _cpu_times(), time.process_time(), time.perf_counter()
    time.sleep(interval)
    after, own1, t1 = _cpu_times(), time.process_time(), time.perf_counter()
    busy = 0.0
    for cpu in allowed:
        if cpu not in before or cpu not in after:
            continue
        idle = after[cpu][0] - before[cpu][0]
        total = after[cpu][1] - before[cpu][1]
        if total > 0:
            busy += 1.0 - min(idle, total) / total
    own = (own1 - own0) / max(t1 - t0, 1e-9)  # cores this process used meanwhile
    return max(0.0, busy - own)


def choose_threads(interval: float = 0.05) -> int:
    """The cores this process may use (os.sched_getaffinity) less those busy with other processes (a core more
    than half busy counts as taken), at least 1."""
    free = len(_allowed_cpus()) - busy_cores(interval)
    return max(1, int(free + 0.5))


def apply_threads(n: int | None = None, device: torch.device | str | None = None) -> int | None:
    """torch.set_num_threads(n) when `device` is the CPU (n None: choose_threads()); returns the thread count set,
    or None for another device (device None: CUDA when available, as EngineConfig's default)."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if torch.device(device).type != "cpu":
        return None
    if n is not None and n < 1:
        raise EagleSpecError(f"threads must be >= 1, got {n}")
    n = choose_threads() if n is None else n
    torch.set_num_threads(n)
    return n
