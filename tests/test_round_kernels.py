"""round_tail (a round graph's commit, next inputs and result row in one kernel, eaglespec.kernels.round_tail) under
Triton's CPU interpreter (TRITON_INTERPRET=1, set by conftest): bitwise the torch tail's outputs on random rounds (a
path row that is another path row's source included). Round graphs with it: tests/test_tree_kernels.py."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from eaglespec.kernels import round_tail as RK


def _round(seed: int, dtype: torch.dtype, p: int = 5, t: int = 12, path: list[int] | None = None,
           flags_bool: bool = False) -> dict:
    """The tail's inputs for a random round: a path of m rows (increasing, from the root), order = the path's rows,
    then the other rows, cut to P."""
    g = torch.Generator().manual_seed(seed)
    if path is None:
        m = int(torch.randint(1, p + 1, (1,), generator=g))
        rest = sorted(torch.randperm(t - 1, generator=g)[: m - 1].add(1).tolist())
        path = [0, *rest]
    m = len(path)
    order = torch.tensor((path + [r for r in range(t) if r not in path])[:p])
    layers, heads, slots, d, f = 2, 2, 40, 8, 24
    tlen = 17
    flags = torch.randint(0, 2, (4,), generator=g)
    return dict(cache=torch.randn(layers, 2, heads, slots, d, generator=g).to(dtype),
                ids=torch.randint(0, 90, (64,), generator=g), state_out=torch.zeros(4 + p, dtype=torch.long),
                feats_out=torch.zeros(p, f, dtype=dtype), feats=torch.randn(t, f, generator=g).to(dtype),
                tokens=torch.randint(0, 90, (t,), generator=g), parents=torch.randint(-1, t, (t,), generator=g),
                depths=torch.randint(0, 6, (t,), generator=g), flags=flags.bool() if flags_bool else flags,
                m=torch.tensor(m), bonus=torch.randint(0, 90, (1,), generator=g), order=order,
                tlen=torch.tensor(tlen), base=torch.tensor(11),
                steps=(torch.arange(p), torch.arange(p) + 1, (torch.arange(p) + 1).clamp(max=p - 1)))


def _clone(args: dict) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}


@pytest.mark.parametrize("seed,dtype", [(0, torch.float32), (1, torch.bfloat16), (2, torch.float32),
                                        (3, torch.bfloat16)])
def test_round_tail_is_the_torch_tail(seed, dtype):
    args = _round(seed, dtype, flags_bool=seed % 2 == 1)
    ref, got = _clone(args), _clone(args)
    want = RK.round_tail_ref(**ref)
    res = RK.round_tail(**got)
    assert torch.equal(res, want)
    for name in ("cache", "ids", "state_out", "feats_out"):  # bitwise: raw copies and integer arithmetic
        assert torch.equal(got[name].view(torch.uint8), ref[name].view(torch.uint8)), name
    moved = not torch.equal(args["order"], torch.arange(args["order"].numel()))
    assert torch.equal(got["cache"], args["cache"]) is not moved  # the commit moved rows where the path skips some


def test_round_tail_reads_every_row_before_writing():
    """Path rows 0, 1, 3, 4: slot tlen + 2 takes row 3 while order[4] = 2 (a row past the path) must read the old
    row 2, as index_select's copy does; and a full path (m = P) takes the bonus only at its last row."""
    for path in ([0, 1, 3, 4], [0, 2, 3, 6, 9]):
        args = _round(3, torch.float32, p=5, t=12, path=path)
        ref, got = _clone(args), _clone(args)
        assert torch.equal(RK.round_tail(**got), RK.round_tail_ref(**ref))
        assert torch.equal(got["cache"], ref["cache"]) and torch.equal(got["state_out"], ref["state_out"])
        tlen = int(args["tlen"])
        assert torch.equal(got["cache"][:, :, :, tlen + 2], args["cache"][:, :, :, tlen + path[2]])
