"""bench/vocab_coverage.py: the share of answer tokens a draft vocabulary cannot draft, as is and grown."""

from __future__ import annotations

import torch

from conftest import bench_module


def test_outside_share_and_grown_shares():
    vc = bench_module("vocab_coverage")
    in_vocab = torch.zeros(10, dtype=torch.bool)
    draft_ids = torch.tensor([1, 2, 5])
    in_vocab[draft_ids] = True
    answers = [[1, 2, 3, 3], [5, 7, 9, 1]]  # 3, 3, 7, 9 outside: 4 of 8
    assert vc.outside_share(answers, in_vocab) == 0.5
    counts = torch.zeros(10, dtype=torch.long)
    counts[3], counts[9], counts[7], counts[4] = 50, 40, 30, 45  # 4 is frequent but never answered
    shares = vc.grown_shares(answers, draft_ids, counts, [3, 4, 5, 6, 7])
    # size 3: the draft ids; then id 3 joins (7 and 9 left: 2 of 8), id 4 (never answered), id 9, id 7
    assert shares == {3: 0.5, 4: 0.25, 5: 0.25, 6: 0.125, 7: 0.0}
