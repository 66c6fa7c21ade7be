"""Fit a tiny drafter that agrees with a tiny target often (test/bench utility, not the trainer).

Data: the target's own greedy continuations of random prompts. Loss: teacher-forced next-next
token CE (contract 4: row t = f_t + embed(x_{t+1}) -> x_{t+2}), unrolled `steps` times as at
inference (EAGLE-3 "training-time test"): unrolled step j row t sits at position t+j, takes the
state step j-1 produced for row t and the token x_{t+j+1}, and sees the real rows 0..t plus its own
unrolled rows of steps 1..j only (the mask the proposer uses over the drafter's KV).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from eaglespec.backends.hf import HFTarget
from eaglespec.engine.loop import SpeculativeEngine


def greedy_sequences(model: nn.Module, n: int, length: int, seed: int, prompt_len: int = 6) -> torch.Tensor:
    """[n, length]: random prompts of `prompt_len` tokens and the target's greedy continuations
    (one batched forward per token, no cache: tiny models only)."""
    g = torch.Generator().manual_seed(seed)
    vocab = model.get_output_embeddings().weight.shape[0]
    ids = torch.randint(3, vocab, (n, prompt_len), generator=g)
    with torch.no_grad():
        while ids.shape[1] < length:
            ids = torch.cat([ids, model(ids).logits[:, -1:].argmax(-1)], dim=1)
    return ids


def _ttt_visible(seq_of: torch.Tensor, step: int) -> torch.Tensor:
    """[R, (step+1)*R] bool over R rows of packed sequences: real rows of the same sequence up to
    itself, then the row's own unrolled rows of steps 1..step."""
    rows = torch.arange(seq_of.numel())
    same = seq_of[:, None] == seq_of[None, :]
    causal = same & (rows[None, :] <= rows[:, None])
    eye = torch.eye(rows.numel(), dtype=torch.bool)
    return torch.cat([causal] + [eye] * step, dim=1)


def fit_drafter(model: nn.Module, drafter: nn.Module, steps: int = 150, unroll: int = 3, n_seqs: int = 12,
                length: int = 40, lr: float = 3e-3, seed: int = 0) -> nn.Module:
    """Train `drafter` (EAGLE-1 or EAGLE-3) in place on `model`'s greedy continuations; returns it in eval mode.

    All sequences are packed into one row set per step (block-diagonal masks).
    """
    target = HFTarget(model)
    SpeculativeEngine(target, drafter)  # wires embedding / head / feature layers exactly as at inference
    seqs = greedy_sequences(model, n_seqs, length, seed)  # [S, L]
    feats = []
    for seq in seqs:
        target.reset()
        feats.append(target.forward(seq).features)  # [L, F]
    target.reset()
    t = length - 2 - unroll  # rows per sequence with a target at every unrolled step
    feats_rows = torch.cat([f[:t] for f in feats])  # [S*t, F]
    seq_of = torch.arange(n_seqs).repeat_interleave(t)
    pos0 = torch.arange(t).repeat(n_seqs)
    step_tokens = [seqs[:, 1 + j: 1 + j + t].reshape(-1) for j in range(unroll + 1)]  # x_{t+j+1}
    step_labels = [seqs[:, 2 + j: 2 + j + t].reshape(-1) for j in range(unroll + 1)]  # x_{t+j+2}
    masks = [_ttt_visible(seq_of, j) for j in range(unroll + 1)]
    opt = torch.optim.Adam([p for p in drafter.parameters() if p.requires_grad], lr=lr)
    drafter.train()
    for _ in range(steps):
        cache = drafter.new_cache()
        state = drafter.project(feats_rows)
        loss = 0.0
        for j in range(unroll + 1):
            logits, state = drafter(state, step_tokens[j], pos0 + j, cache, visible=masks[j])
            loss = loss + F.cross_entropy(logits.float(), step_labels[j]) * (0.8 ** j)
        opt.zero_grad()
        loss.backward()
        opt.step()
    drafter.eval()
    return drafter
