"""The soft-row compiler (contract 4 at training time): the article's oracle and its edge cases."""

from __future__ import annotations

import torch

from eaglespec.train.data import Sample, pack
from eaglespec.train.rows import compile_rows


def _gather(plan, feats, tokens):
    """What the trainer reads for step 0: inputs (f_t, x_{t+1}) and targets (f_{t+1}, q_{t+2} = row t+1)."""
    return feats[plan.src], tokens[plan.next_index[0]], feats[plan.next_index[0]], plan.next_index[0]


def test_oracle_rows():
    tokens = torch.tensor([11, 12, 13, 14, 15, 16])
    valid = torch.tensor([1, 1, 1, 1, 1, 0], dtype=torch.bool)
    plan = compile_rows(valid, torch.zeros(6, dtype=torch.long), valid.clone())
    assert plan.num_rows == 4
    assert plan.src.tolist() == [0, 1, 2, 3]
    feats = torch.arange(6.0)[:, None] * 10  # f_t = 10 t
    f_in, x_in, f_tgt, q_row = _gather(plan, feats, tokens)
    # first row: f_0 + token 12 -> f_1 and q_2 (the distribution computed from f_1 = logits row 1)
    assert (f_in[0].item(), x_in[0].item(), f_tgt[0].item(), q_row[0].item()) == (0.0, 12, 10.0, 1)
    # last row: f_3 + token 15 -> f_4 and q_5 (logits row 4)
    assert (f_in[-1].item(), x_in[-1].item(), f_tgt[-1].item(), q_row[-1].item()) == (30.0, 15, 40.0, 4)
    # slot 5 (padding) is never addressed
    addressed = set(plan.src.tolist()) | set(plan.next_index.flatten().tolist())
    assert 5 not in addressed
    assert plan.supervised.all()


def test_off_by_one_would_be_caught():
    """A shape-compatible shift (pairing f_t with x_t) differs from the plan: the oracle catches it."""
    tokens = torch.tensor([11, 12, 13, 14, 15, 16])
    valid = torch.ones(6, dtype=torch.bool)
    plan = compile_rows(valid, torch.zeros(6, dtype=torch.long), valid)
    assert not torch.equal(tokens[plan.src], tokens[plan.next_index[0]])
    assert (tokens[plan.next_index[0]] - tokens[plan.src]).eq(1).all()


def test_padding_tail_and_steps():
    valid = torch.tensor([1, 1, 1, 0, 0], dtype=torch.bool)
    plan = compile_rows(valid, torch.zeros(5, dtype=torch.long), valid, steps=3)
    assert plan.src.tolist() == [0, 1]
    # step s of row t needs t+1+s in the segment: row 0 has steps 0, 1; row 1 only step 0
    assert plan.valid.tolist() == [[True, True], [True, False], [False, False]]
    assert plan.next_index.max().item() <= 2  # never reads padding, even for invalid steps
    assert plan.next_index[1, 0].item() == 2


def test_packed_segments_never_cross():
    a = Sample(torch.tensor([5, 6, 7]), torch.tensor([1, 1, 1], dtype=torch.bool))
    b = Sample(torch.tensor([8, 9, 10, 11]), torch.tensor([1, 1, 1, 1], dtype=torch.bool))
    p = pack([a, b], length=9)
    assert p.position.tolist()[:7] == [0, 1, 2, 0, 1, 2, 3]
    plan = compile_rows(p.valid, p.segment, p.loss_mask, p.position, steps=4)
    assert plan.src.tolist() == [0, 1, 3, 4, 5]  # no row at 2 (its x_{t+1} is in the next segment)
    for s in range(4):
        ok = plan.valid[s]
        assert (p.segment[plan.next_index[s]][ok] == plan.segment[ok]).all()
        assert (p.segment[plan.next_index[s]] == plan.segment).all()  # even invalid steps stay in-segment
        assert p.valid[plan.next_index[s]].all()
    assert plan.position.tolist() == [0, 1, 0, 1, 2]


def test_supervision_vs_context():
    """Rows whose source is outside the loss mask exist (attention context) but are not supervised."""
    valid = torch.ones(6, dtype=torch.bool)
    loss = torch.tensor([0, 0, 1, 1, 1, 1], dtype=torch.bool)  # prompt = tokens 0, 1
    plan = compile_rows(valid, torch.zeros(6, dtype=torch.long), loss, steps=2)
    assert plan.src.tolist() == [0, 1, 2, 3, 4]
    assert plan.supervised[0].tolist() == [False, False, True, True, True]
    # step 1 of row t has source t+1: row 1 becomes supervised there
    assert plan.supervised[1].tolist() == [False, True, True, True, False]


def test_zero_row_batch():
    valid = torch.tensor([1, 0, 0], dtype=torch.bool)
    plan = compile_rows(valid, torch.zeros(3, dtype=torch.long), valid, steps=3)
    assert plan.num_rows == 0 and plan.supervised.numel() == 0
    plan = compile_rows(torch.ones(4, dtype=torch.bool), torch.zeros(4, dtype=torch.long),
                        torch.zeros(4, dtype=torch.bool))
    assert plan.num_rows == 3 and not plan.supervised.any()
