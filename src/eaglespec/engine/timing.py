"""Timing primitives shared by the scale benchmark and the cost calibration of `--tree auto`.

Each times one piece of a round on a built target or engine: plain decoding steps, verify forwards over R rows,
drafter steps over n rows and whole engine rounds. CUDA timings use CUDA events around blocks of back-to-back calls
(median over samples); CPU timings use perf_counter.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch

from eaglespec.errors import EagleSpecError
from eaglespec.tree.core import TreeSpec


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_ms(fn: Callable[[], Any], device: torch.device, samples: int, calls: int = 1, warmup: int = 1
             ) -> list[float]:
    """Per-call milliseconds of `fn`: `warmup` untimed calls (captures), then `samples` blocks of `calls`
    back-to-back calls, each block's time / calls (CUDA events on CUDA, perf_counter on CPU)."""
    for _ in range(warmup):
        fn()
    sync(device)
    out = []
    for _ in range(samples):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) / calls)
        else:
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            out.append((time.perf_counter() - t0) * 1e3 / calls)
    return out


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def random_tokens(n: int, vocab: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """[n] long random token ids (drawn on the CPU from `gen`, then moved)."""
    return torch.randint(3, vocab, (n,), generator=gen).to(device)


def prefill_random(target, n: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    """Reset the target, forward and commit a random n-token prompt; returns the prompt [n]."""
    prompt = random_tokens(n, vocab, gen, target.device)
    target.reset()
    target.forward(prompt)
    target.commit(torch.arange(n, device=target.device))
    return prompt


def time_plain_steps(target, context: int, steps: int, samples: int, gen: torch.Generator) -> list[float]:
    """ms per token of plain decoding on a FastTarget after a random `context`-token prompt: per sample, `steps`
    back-to-back steps (one-row forward, argmax, commit) from the same prefix (the first sample is a warm-up)."""
    dev = target.device
    prompt = prefill_random(target, context, target.vocab_size, gen)
    keep = torch.zeros(1, dtype=torch.long, device=dev)

    def decode() -> None:
        target.set_committed(context)
        tok = prompt[-1:]
        for _ in range(steps):
            out = target.forward(tok)
            tok = out.logits[-1:].argmax(-1)  # [1], on the device
            target.commit(keep)

    return [ms / steps for ms in timed_ms(decode, dev, samples)]


def _verify_once(target, tokens: torch.Tensor, depths: torch.Tensor, visible: torch.Tensor, none: torch.Tensor
                 ) -> None:
    """One verify forward, its rows then discarded."""
    target.forward(tokens, depths, visible)
    target.commit(none)


def _draft_once(runner, state: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, keep: int) -> None:
    """One drafter step over len(tokens) causal rows, then cropped back to `keep` rows."""
    runner.run(state, tokens, positions)
    runner.crop(keep)


def time_verify_curve(target, contexts: Sequence[int], rows: Sequence[int], samples: int, gen: torch.Generator,
                      calls: int = 5) -> dict[int, list[dict[str, Any]]]:
    """{context: [{rows, ms, ratio (to the first row count), samples}]}: one FastTarget forward over R rows with a
    chain-shaped ancestry mask (depths 0..R-1, lower-triangular visibility) after a `context`-row prefix, the
    rows discarded after each forward (commit of none). One random prompt of the largest context is prefilled;
    shorter contexts take its prefix (measured longest first: a context's rows overwrite only slots past it)."""
    dev = target.device
    prefill_random(target, max(contexts), target.vocab_size, gen)
    none = torch.zeros(0, dtype=torch.long, device=dev)
    out: dict[int, list[dict[str, Any]]] = {}
    for ctx in sorted(set(contexts), reverse=True):
        curve = []
        for r in rows:
            tokens = random_tokens(r, target.vocab_size, gen, dev)
            depths = torch.arange(r, device=dev)
            visible = torch.ones(r, r, dtype=torch.bool, device=dev).tril()
            target.set_committed(ctx)
            ms = timed_ms(partial(_verify_once, target, tokens, depths, visible, none), dev, samples, calls=calls)
            curve.append({"rows": r, "ms": median(ms), "samples": ms})
        base = curve[0]["ms"]
        for point in curve:
            point["ratio"] = point["ms"] / base
        out[ctx] = curve
    return {ctx: out[ctx] for ctx in contexts}


def time_draft_steps(proposer, context: int, rows: Sequence[int], samples: int, gen: torch.Generator,
                     vocab: int, calls: int = 5) -> dict[int, dict[str, Any]]:
    """{n: {ms, samples}}: one step of the proposer's row runner over n causal rows after the drafter caught up on
    `context` rows of random target features (the rows cropped off after each step)."""
    drafter, runner, dev = proposer.drafter, proposer.runner, proposer.device
    dtype = next(drafter.parameters()).dtype
    width = drafter.fc.weight.shape[1]  # n_aux * target hidden
    feats = torch.randn(context + max(rows), width, generator=gen).to(device=dev, dtype=dtype)
    tokens = random_tokens(context + max(rows) + 1, vocab, gen, dev)
    proposer.reset()
    proposer.catch_up(feats[:context], tokens[1:context + 1])
    out: dict[int, dict[str, Any]] = {}
    for n in rows:
        state = drafter.project(feats[context:context + n])  # [n, H]
        toks = tokens[context + 1:context + 1 + n]
        positions = torch.arange(context, context + n, device=dev)
        ms = timed_ms(partial(_draft_once, runner, state, toks, positions, context), dev, samples, calls=calls)
        out[n] = {"ms": median(ms), "samples": ms}
    proposer.reset()
    return out


def time_rounds(engine, prompt: list[int], spec: TreeSpec, new_tokens: int, repeats: int) -> dict[str, Any]:
    """ms per round of engine.stream(prompt, new_tokens, spec=spec): after one untimed run (captures), `repeats`
    runs, each timed from the end of its first round to its last (the drafter's prefill and the first round
    left out) and divided by the rounds in between. Returns {ms, samples, rounds, tau, tokens_per_s}."""
    samples, rounds, taus, rates = [], 0, [], []
    for i in range(repeats + 1):
        marks, tokens = [], []
        for emitted in engine.stream(prompt, new_tokens, spec=spec):
            marks.append(time.perf_counter())
            tokens.append(len(emitted))
        timed = len(marks) - 2  # rounds after the first
        if timed < 1:
            raise EagleSpecError(f"{new_tokens} new tokens give no round to time after the first: ask for more")
        if i == 0:
            continue
        elapsed = marks[-1] - marks[1]
        samples.append(elapsed * 1e3 / timed)
        rounds = timed
        taus.append(sum(tokens[2:]) / timed)
        rates.append(sum(tokens[2:]) / elapsed)
    return {"ms": median(samples), "samples": samples, "rounds": rounds, "tau": median(taus),
            "tokens_per_s": median(rates)}
