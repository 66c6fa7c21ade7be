"""Publication is one transaction (contract 7): accepted rows' KV and features are gathered by the
flatten map (never by token equality), rejected rows dropped, the drafter reseeded from verified rows."""

from __future__ import annotations

import pytest
import torch

from eaglespec.backends.hf import HFTarget
from eaglespec.engine.loop import SpeculativeEngine
from eaglespec.tree.core import DraftTree, TreeSpec, flatten
from eaglespec.verify import greedy_accept

from conftest import reference_greedy, tiny_target

PROMPT = [7, 3, 19, 44, 5, 61, 12]


def repeated_token_tree(root: int, g1: int, g2: int, wrong: int, wrong2: int) -> DraftTree:
    """root -> [1] wrong -> [3] g2, [4] g1 ; root -> [2] g1 -> [5] g2 -> [6] wrong2.

    The accepted path is 0 -> 2 -> 5. g2 first occurs at the rejected node 3 (before 5), and g1 also
    sits at the rejected node 4: gathering rows by token equality would publish the wrong KV.
    """
    return DraftTree(tokens=torch.tensor([root, wrong, g1, g2, g1, g2, wrong2]),
                     parents=torch.tensor([-1, 0, 0, 1, 1, 2, 5]),
                     depths=torch.tensor([0, 1, 1, 2, 2, 2, 3]))


def distinct_case(arch: str, attn: str = "sdpa", n: int = 4):
    """A tiny target whose greedy continuation of PROMPT starts with 4 distinct tokens (seeded search)."""
    for seed in range(2, 40):
        model = tiny_target(arch, seed=seed, attn=attn)
        ref = reference_greedy(model, PROMPT, n)
        if len(set(ref[:4])) == 4:
            return model, ref
    raise AssertionError("no seed gives 4 distinct greedy tokens")


def _kv(target: HFTarget) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys.clone(), layer.values.clone()) for layer in target.cache.layers]


def _wrong(*avoid: int) -> int:
    return next(t for t in range(3, 96) if t not in avoid)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_commit_gathers_by_row_not_by_token(arch, attn):
    model, ref = distinct_case(arch, attn)  # root, g1, g2, g3
    root, g1, g2, g3 = ref
    wrong = _wrong(g1, g2, g3)
    wrong2 = _wrong(g1, g2, g3, wrong)
    tree = repeated_token_tree(root, g1, g2, wrong, wrong2)
    assert int((tree.tokens == g2).nonzero()[0]) == 3  # g2's first occurrence is on the rejected branch

    target = HFTarget(model, feature_layer_ids=(1, 3))
    prompt = torch.tensor(PROMPT)
    target.forward(prompt)
    target.commit(torch.arange(prompt.numel()))
    flat = flatten(tree)
    out = target.forward(flat.tokens, flat.depths, flat.visible)
    acc = greedy_accept(flat, out.logits)
    assert acc.rows.tolist() == [0, 2, 5] and acc.bonus == g3
    target.commit(acc.rows)
    published = _kv(target)
    feats = out.features[acc.rows]

    plain = HFTarget(model, feature_layer_ids=(1, 3))
    full = torch.tensor([*PROMPT, root, g1, g2])
    plain_out = plain.forward(full)
    plain.commit(torch.arange(full.numel()))
    assert target.committed_len == plain.committed_len == full.numel()
    for (k, v), (pk, pv) in zip(published, _kv(plain)):
        assert k.shape == pk.shape
        torch.testing.assert_close(k, pk, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v, pv, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(feats, plain_out.features[-3:], atol=1e-5, rtol=1e-5)

    # the next verification forward sees exactly the published prefix: same logits as the plain path
    nxt = target.forward(torch.tensor([g3]))
    plain_nxt = plain.forward(torch.tensor([g3]))
    torch.testing.assert_close(nxt.logits, plain_nxt.logits, atol=1e-5, rtol=1e-5)


class StubProposer:
    """Returns the repeated-token tree once, then nothing; records what the engine reseeds it with."""

    def __init__(self, tree_for_root):
        self.tree_for_root = tree_for_root
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.committed = 0
        self.sampling = None
        self.generator = None

    def reset(self) -> None:
        self.committed = 0
        self.calls.clear()

    def propose(self, root: int, features: torch.Tensor, next_tokens: torch.Tensor) -> DraftTree:
        self.calls.append((features.clone(), next_tokens.clone()))
        self.committed += features.shape[0]
        tree = self.tree_for_root(root) if len(self.calls) == 1 else None
        if tree is None:
            return DraftTree(tokens=torch.tensor([root]), parents=torch.tensor([-1]), depths=torch.tensor([0]))
        return tree


def test_engine_reseeds_drafter_from_verified_rows_only(arch):
    model, ref = distinct_case(arch, n=12)
    root, g1, g2, g3 = ref[:4]
    wrong = _wrong(g1, g2, g3)
    tree = repeated_token_tree(root, g1, g2, wrong, _wrong(g1, g2, g3, wrong))
    target = HFTarget(model)
    engine = SpeculativeEngine(target, None, TreeSpec("dynamic"))
    target.set_feature_layers((2, 4))
    stub = StubProposer(lambda r: tree if r == root else None)
    engine.proposer = stub
    out = engine.generate(PROMPT, max_new_tokens=12)
    assert out.token_ids == ref
    assert out.rounds[0].accepted == 2 and out.rounds[0].drafted == 6

    plain = HFTarget(model, feature_layer_ids=(2, 4))
    full = torch.tensor(PROMPT + ref)
    plain_feats = plain.forward(full).features  # features of every verified position
    n = len(PROMPT)
    # round 1 is seeded with the prompt's features paired with x_{t+1} (the root last)
    f1, t1 = stub.calls[0]
    torch.testing.assert_close(f1, plain_feats[:n], atol=1e-5, rtol=1e-5)
    assert t1.tolist() == [*PROMPT[1:], root]
    # round 2: ONLY the 3 verified rows (root, g1, g2) of the 7-row tree, paired with g1, g2, bonus g3
    f2, t2 = stub.calls[1]
    assert f2.shape[0] == 3
    torch.testing.assert_close(f2, plain_feats[n:n + 3], atol=1e-5, rtol=1e-5)
    assert t2.tolist() == [g1, g2, g3]
    # and from then on every reseed is the features of the positions verified since
    total = sum(f.shape[0] for f, _ in stub.calls)
    seen = torch.cat([f for f, _ in stub.calls])
    torch.testing.assert_close(seen, plain_feats[:total], atol=1e-5, rtol=1e-5)
