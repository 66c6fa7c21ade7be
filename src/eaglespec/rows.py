"""Batch rows leaving: which rows stay, in what order, and the buffer rows that move (the batched target, the batched
drafts and the engine keep their rows in the same order); and how their row and slot buffers grow."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from eaglespec.tensors import to_device_all


def compaction(batch: int, gone: Iterable[int]) -> list[int]:
    """The rows of `batch` that stay when rows `gone` leave, in their new order: order[i] is the old row of new row i.
    A staying row below the new size keeps its place; each hole there takes a staying row from above it (in order),
    so only as many rows move as leave below the new size."""
    gone = set(gone)
    if not gone <= set(range(batch)):
        raise ValueError(f"rows {sorted(gone)} are not all rows of a batch of {batch}")
    n = batch - len(gone)
    order = list(range(n))
    movers = (b for b in range(n, batch) if b not in gone)
    for hole in (b for b in range(n) if b in gone):
        order[hole] = next(movers)
    return order


def grown(cap: int, need: int, least: int) -> int:
    """A buffer dimension's capacity for `need`: `cap` (at least `least`) doubled until it holds it."""
    new = max(cap, least)
    while new < need:
        new *= 2
    return new


def grown_bytes(cap: tuple[int, int], need: tuple[int, int], least_slots: int, per_slot: int, extra_rows: int = 0
                ) -> int:
    """Bytes [rows, slots] buffers of `per_slot` bytes a slot hold once they have room for need = (rows, slots),
    grown by `grown` from cap = (rows, slots) (rows from 1, slots from least_slots), the present buffers counted too
    when they must grow (both are held while the rows are copied over); extra_rows: rows kept beside them with
    their slots."""
    (cap_rows, cap_slots), (rows, slots) = cap, need
    held = (cap_rows + extra_rows) * cap_slots * per_slot
    if rows <= cap_rows and slots <= cap_slots:
        return held
    return held + (grown(cap_rows, rows, 1) + extra_rows) * grown(cap_slots, slots, least_slots) * per_slot


def move_rows(buffers: Iterable[torch.Tensor], order: list[int], dim: int = 0) -> None:
    """Apply a compaction to buffers whose dim `dim` is the batch row: new row i takes old row order[i] (only the
    rows that move are copied; every source lies above every destination)."""
    moved = [(i, b) for i, b in enumerate(order) if i != b]
    buffers = list(buffers)
    if not moved or not buffers:
        return
    dst, src = to_device_all(buffers[0].device, [i for i, _ in moved], [b for _, b in moved])
    for x in buffers:
        x.index_copy_(dim, dst, x.index_select(dim, src))
