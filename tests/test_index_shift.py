"""Contract 4: drafter row t pairs target feature f_t with the embedding of x_{t+1} at position t.

Hand-built tensors: a fake target whose feature at row t is the constant t, and a recording drafter
that checks every row it sees. An off-by-one pairing (f_t with x_t) has the same shapes, so only
such a check catches it; the negative control injects that mistake and the check must fail.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import eaglespec.engine.loop as engine_mod
from eaglespec.backends.base import TargetOutput
from eaglespec.draft.layers import KVCache
from eaglespec.engine.loop import SpeculativeEngine
from eaglespec.tree.core import TreeSpec

V = 50


def successor(tokens: torch.Tensor) -> torch.Tensor:
    return (tokens * 7 + 3) % V


class FakeTarget:
    """Next token = successor(token); feature of the row at position p = p (one number per row)."""

    name = "fake"
    num_layers, hidden_size, vocab_size = 4, 1, V

    def __init__(self) -> None:
        self.device = torch.device("cpu")
        self.reset()

    def reset(self) -> None:
        self.committed_len = 0
        self.tokens: list[int] = []

    def set_feature_layers(self, ids) -> None:
        pass

    def embedding(self) -> nn.Module:
        return nn.Identity()

    def forward(self, tokens, depths=None, visible=None) -> TargetOutput:
        if depths is None:
            depths = torch.arange(tokens.shape[0])
        positions = (self.committed_len + depths).float()
        logits = torch.nn.functional.one_hot(successor(tokens), V).float() * 10
        return TargetOutput(logits=logits, features=positions[:, None])

    def commit(self, keep: torch.Tensor) -> None:
        self.committed_len += keep.shape[0]


class RecordingDrafter(nn.Module):
    """Predicts successor(token) (so drafts are accepted); its state is the row's position."""

    def __init__(self) -> None:
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(1))
        self.rows: list[tuple[float, int, int]] = []  # (state, token, position)
        self.feature_layer_ids = (0,)
        self.d2t = torch.zeros(V, dtype=torch.long)

    def new_cache(self):
        return [KVCache()]

    def project(self, features: torch.Tensor) -> torch.Tensor:
        return features.clone()

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def forward(self, state, tokens, positions, cache, visible=None):
        for s, t, p in zip(state[:, 0].tolist(), tokens.tolist(), positions.tolist()):
            self.rows.append((s, t, p))
        logits = torch.nn.functional.one_hot(successor(tokens), V).float() * 10
        return logits, state + 1  # the next row's state: the next position


def rows_follow_contract(rows, sequence: list[int]) -> bool:
    """Every row: state (= feature position t) == position, token == x_{t+1}."""
    return all(int(s) == p and (p + 1 >= len(sequence) or sequence[p + 1] == t) for s, t, p in rows)


def run(k: int) -> tuple[list[tuple[float, int, int]], list[int], engine_mod.GenerationResult]:
    drafter = RecordingDrafter()
    engine = SpeculativeEngine(FakeTarget(), drafter, TreeSpec("chain", depth=k))
    prompt = [1, 2, 3, 4]
    out = engine.generate(prompt, max_new_tokens=20)
    return drafter.rows, prompt + out.token_ids, out


@pytest.mark.parametrize("k", [1, 3, 4])
def test_rows_pair_feature_t_with_token_t_plus_1(k):
    rows, sequence, out = run(k)
    assert rows, "the drafter saw no rows"
    assert rows_follow_contract(rows, sequence)
    assert out.tau == pytest.approx(k + 1, rel=0.2)  # the perfect drafter is accepted


def test_off_by_one_pairing_is_caught(monkeypatch):
    """Negative control: pair f_t with x_t (same shapes) and the contract check must fail."""
    monkeypatch.setattr(engine_mod, "shifted_tokens", lambda ids, start, count: ids[start : start + count])
    rows, sequence, _ = run(3)
    assert not rows_follow_contract(rows, sequence)
