"""eaglespec.train.vocab_coverage: the share of answer tokens (and of the target's mass) a draft vocabulary
cannot draft, as is and grown."""

from __future__ import annotations

import torch

from eaglespec.train import vocab_coverage as vc


def test_outside_share_and_grown_masks():
    in_vocab = torch.zeros(10, dtype=torch.bool)
    draft_ids = torch.tensor([1, 2, 5])
    in_vocab[draft_ids] = True
    answers = [[1, 2, 3, 3], [5, 7, 9, 1]]  # 3, 3, 7, 9 outside: 4 of 8
    assert vc.outside_share(answers, in_vocab) == 0.5
    counts = torch.zeros(10, dtype=torch.long)
    counts[3], counts[9], counts[7], counts[4] = 50, 40, 30, 45  # 4 is frequent but never answered
    shares = {n: vc.outside_share(answers, m) for n, m in vc.grown_masks(draft_ids, counts, [3, 4, 5, 6, 7]).items()}
    # size 3: the draft ids; then id 3 joins (7 and 9 left: 2 of 8), id 4 (never answered), id 9, id 7
    assert shares == {3: 0.5, 4: 0.25, 5: 0.25, 6: 0.125, 7: 0.0}


def test_outside_mass_averages_rows():
    in_vocab = torch.tensor([True, True, False, False])
    probs = torch.tensor([[0.5, 0.2, 0.3, 0.0],    # 0.3 outside
                          [0.1, 0.0, 0.4, 0.5]])   # 0.9 outside
    assert abs(vc.outside_mass(probs, in_vocab) - 0.6) < 1e-6
    assert vc.outside_mass(probs[:0], in_vocab) == 0.0


class _RowTarget:
    """A target whose logits row r peaks (value 5) at token r: shows which row answer_probs takes."""

    def __init__(self, vocab: int):
        self.vocab, self.resets = vocab, 0

    def reset(self):
        self.resets += 1

    def forward(self, ids):
        logits = torch.zeros(ids.numel(), self.vocab)
        logits[torch.arange(ids.numel()), torch.arange(ids.numel())] = 5.0
        return type("Out", (), {"logits": logits})()


def test_answer_probs_rows_predict_the_answer_tokens_at_temperature():
    target = _RowTarget(8)
    prompt, answer = [4, 4, 4], [6, 7]  # rows 2 and 3 predict tokens 3 and 4 (the answer's)
    p1 = vc.answer_probs(target, prompt, answer, 1.0)
    assert p1.shape == (2, 8)
    assert p1.argmax(-1).tolist() == [2, 3]  # not [3, 4] (shifted) nor [0, 1] (the prompt's rows)
    assert torch.allclose(p1.sum(-1), torch.ones(2))
    expected = torch.exp(torch.tensor(5.0)) / (torch.exp(torch.tensor(5.0)) + 7)
    assert abs(float(p1[0, 2]) - float(expected)) < 1e-5
    p_half = vc.answer_probs(target, prompt, answer, 0.5)
    assert float(p_half[0, 2]) > float(p1[0, 2])  # the temperature is applied: sharper at T=0.5
    assert target.resets == 4  # before and after each forward: the target's cache is left clean
