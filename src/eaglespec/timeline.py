"""The device timeline of speculative rounds from torch.profiler events: busy, idle and per-phase device time.

The rounds and their phases are CPU ranges recorded with torch.profiler.record_function: ROUND ("rt:round")
around each round and "rt:<phase>" (PHASES: draft, sync_wait, verify, accept, commit) inside it; round time
outside the phase ranges is "other". Times are microseconds in, milliseconds out. Per round (its host range):
    wall          the round's host range
    busy          the union of device activity intervals (kernels, memcpy, memset) clipped to the round
    idle          wall - busy: device bubbles inside the round; idle_head (round start -> first activity),
                  idle_tail (last activity end -> round end) and max_gap (the longest bubble) break it down
    activities    device activities LAUNCHED in the round (a CUDA graph replay counts every kernel it runs)
    after_round   device time of activities launched in the round that ran after its host range ended
    kinds         {kernel_kind: [count, device us]} of the activities launched in the round
and per phase: host ms, and the busy ms and count of the activities launched inside that phase's range. An
activity belongs to the phase that launched it: its CUPTI correlation id matches the CUDA runtime/driver call
that launched it (cudaLaunchKernel, cudaGraphLaunch, cudaMemcpyAsync, ...), whose host time falls in the
innermost range; else the enclosing profiler op named by its linked_correlation_id stands in
("linked_by_enclosing_op"); else ("unlinked") its own start time. Without CUDA the top-level aten ops' CPU
intervals stand in for activities.
"""

from __future__ import annotations

import bisect
import itertools
import statistics

import torch

PHASES = ("draft", "sync_wait", "verify", "accept", "commit")
ROUND = "rt:round"
LABELS = (ROUND, *(f"rt:{p}" for p in PHASES))


def union(intervals: list[tuple[float, float]], lo: float | None = None, hi: float | None = None
          ) -> list[tuple[float, float]]:
    """Merged intervals, optionally clipped to [lo, hi]."""
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if lo is not None:
            s = max(s, lo)
        if hi is not None:
            e = min(e, hi)
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(e - s for s, e in intervals)


def kernel_kind(name: str, width: int = 60) -> str:
    """A device activity's name without its template and argument lists ("void at::native::foo<float, 4>(...)"
    -> "at::native::foo"), at most `width` characters: kernels of one kind counted together."""
    name = name.removeprefix("void ").strip()
    for stop in ("<", "("):
        if stop in name[1:]:
            name = name[: name.index(stop, 1)]
    return name[:width] or "?"


def round_metrics(start: float, end: float, acts: list[dict], phase_ranges: list[tuple[str, float, float]],
                  launched: list[dict] | None = None) -> dict:
    """One round. acts: {"start", "end", "launch"} device activities (or CPU ops) that may overlap the round;
    launched: those launched in it (default: picked from acts); phase_ranges: (phase, s, e) CPU ranges of the
    labelled phases inside the round. Times in us; the result in ms."""
    busy = union([(a["start"], a["end"]) for a in acts], start, end)
    busy_us = _length(busy)
    gaps = [b[0] - a[1] for a, b in itertools.pairwise(busy)]
    head = (busy[0][0] - start) if busy else end - start
    tail = (end - busy[-1][1]) if busy else 0.0
    if launched is None:
        launched = [a for a in acts if start <= a["launch"] < end]
    after = _length(union([(a["start"], a["end"]) for a in launched], end, None))
    phases: dict[str, dict] = {}
    for phase in (*PHASES, "other"):
        phases[phase] = {"host_ms": 0.0, "busy_ms": 0.0, "activities": 0}
    owner: dict[str, list[tuple[float, float]]] = {}
    for a in launched:
        # the innermost labelled range holding the launch (phase ranges do not nest within one round, except
        # by accident of wrapping; take the shortest)
        holders = [(e - s, p) for p, s, e in phase_ranges if s <= a["launch"] < e]
        phase = min(holders)[1] if holders else "other"
        owner.setdefault(phase, []).append((a["start"], a["end"]))
        phases[phase]["activities"] += 1
    for phase, ivs in owner.items():
        phases[phase]["busy_ms"] = _length(union(ivs)) / 1000
    kinds: dict[str, list[float]] = {}  # name -> [count, device us] of the activities launched in the round
    for a in launched:
        kind = kinds.setdefault(a.get("name", "?"), [0, 0.0])
        kind[0] += 1
        kind[1] += a["end"] - a["start"]
    labelled = 0.0
    for phase, s, e in phase_ranges:
        phases[phase]["host_ms"] += (e - s) / 1000
        labelled += e - s
    phases["other"]["host_ms"] = max(end - start - labelled, 0.0) / 1000
    wall = end - start
    return {"wall_ms": wall / 1000, "busy_ms": busy_us / 1000, "idle_ms": (wall - busy_us) / 1000,
            "idle_head_ms": head / 1000, "idle_tail_ms": tail / 1000,
            "max_gap_ms": max(gaps, default=0.0) / 1000, "activities": len(launched),
            "after_round_ms": after / 1000, "phases": phases, "kinds": kinds}


def _is_device(evt) -> bool:
    return evt.device_type != torch.autograd.DeviceType.CPU


def timeline(events, cuda: bool) -> tuple[list[dict], dict]:
    """Per-round metrics from profiler FunctionEvents, and linkage counts."""
    rounds = sorted((e.time_range.start, e.time_range.end) for e in events
                     if e.name == ROUND and not _is_device(e))
    phase_ranges = sorted((e.name[3:], e.time_range.start, e.time_range.end) for e in events
                          if e.name in LABELS and e.name != ROUND and not _is_device(e))
    acts: list[dict] = []
    linked = by_op = unlinked = 0
    if cuda:
        launches: dict[int, float] = {}  # CUPTI correlation id -> host time of the runtime/driver call
        ops: dict[int, float] = {}  # profiler op correlation id -> the op's host start (fallback)
        for e in events:
            if _is_device(e):
                continue
            if e.name.startswith("cu"):  # cudaLaunchKernel, cudaGraphLaunch, cudaMemcpyAsync, cuLaunchKernel
                launches.setdefault(e.id, e.time_range.start)
            else:
                ops.setdefault(e.id, e.time_range.start)
        for e in events:
            if not _is_device(e) or e.name in LABELS or getattr(e, "is_user_annotation", False):
                continue
            start = e.time_range.start
            launch = launches.get(e.id)
            if launch is not None and launch <= start + 1.0:
                linked += 1
            else:  # the enclosing profiler op (aten op or an rt:* range) named by linked_correlation_id
                launch = ops.get(getattr(e, "linked_correlation_id", 0) or -1)
                if launch is not None and launch <= start + 1.0:
                    by_op += 1
                else:
                    unlinked += 1
                    launch = start
            acts.append({"start": start, "end": e.time_range.end, "launch": launch,
                         "name": kernel_kind(e.name)})
    else:  # CPU smoke path: top-level aten ops stand in for kernels
        for e in events:
            if _is_device(e) or not e.name.startswith("aten::"):
                continue
            parent, top = e.cpu_parent, True
            while parent is not None:
                if parent.name.startswith("aten::"):
                    top = False
                    break
                parent = parent.cpu_parent
            if top:
                start = e.time_range.start
                acts.append({"start": start, "end": e.time_range.end, "launch": start, "name": e.name})
    by_start = sorted(acts, key=lambda a: a["start"])
    starts = [a["start"] for a in by_start]
    by_launch = sorted(acts, key=lambda a: a["launch"])
    launch_times = [a["launch"] for a in by_launch]
    longest = max((a["end"] - a["start"] for a in acts), default=0.0)
    out = []
    for s, e in rounds:
        mine = [p for p in phase_ranges if s <= p[1] and p[2] <= e]
        running = [a for a in by_start[bisect.bisect_left(starts, s - longest):bisect.bisect_left(starts, e)]
                   if a["end"] > s]
        launched = by_launch[bisect.bisect_left(launch_times, s):bisect.bisect_left(launch_times, e)]
        out.append(round_metrics(s, e, running, mine, launched))
    return out, {"device_activities_linked": linked, "linked_by_enclosing_op": by_op,
                 "device_activities_unlinked": unlinked}


def summarize(rounds: list[dict], host: list[dict]) -> dict:
    """Medians and means over rounds of round_metrics' numbers, by phase too, of the engine's own host split
    (host: {"draft_ms", "verify_ms", "commit_ms"} per round) and the activities by kind (kinds_per_round)."""
    def stat(values: list[float]) -> dict:
        return {"median": round(statistics.median(values), 4), "mean": round(statistics.fmean(values), 4)} \
            if values else {"median": 0.0, "mean": 0.0}

    keys = ("wall_ms", "busy_ms", "idle_ms", "idle_head_ms", "idle_tail_ms", "max_gap_ms", "activities",
            "after_round_ms")
    out = {k: stat([r[k] for r in rounds]) for k in keys}
    out["phases"] = {p: {k: stat([r["phases"][p][k] for r in rounds])
                         for k in ("host_ms", "busy_ms", "activities")}
                     for p in (*PHASES, "other")}
    out["engine_host_split_ms"] = {k: stat([h[k] for h in host])
                                   for k in ("draft_ms", "verify_ms", "commit_ms")}
    out["kinds"] = kinds_per_round(rounds)
    return out


def kinds_per_round(rounds: list[dict]) -> list[dict]:
    """Activities by kind (kernel_kind), most numerous first: the mean count and device us per round."""
    total: dict[str, list[float]] = {}
    for r in rounds:
        for name, (count, us) in r.get("kinds", {}).items():
            acc = total.setdefault(name, [0, 0.0])
            acc[0] += count
            acc[1] += us
    n = max(len(rounds), 1)
    ranked = sorted(total.items(), key=lambda kv: (-kv[1][0], kv[0]))
    return [{"kind": name, "per_round": round(c / n, 2), "us_per_round": round(us / n, 2)}
            for name, (c, us) in ranked]
