"""Sampling: the logits processors shared by drafting, verification and the bonus token.

`process_logits` turns logits into the distribution sampled from: temperature -> top-k -> top-p -> min-p, in
Hugging Face's order with its tie and keep-at-least-one rules. The target's p (verification, bonus and correction
tokens) is always `process_logits(target_logits, cfg.target)`; the drafter's q is `process_logits(draft_logits,
cfg.draft_params)`. Temperature 0 means greedy: the engine takes verify.greedy_accept, not a one-hot sample.

Why each acceptance scheme (verify.tree_rejection_sample) is lossless (contract 2, docs/contracts.md):

* Chain, drafts sampled from q: accept x with prob min(1, p(x)/q(x)), else emit a sample of
  norm(max(0, p - q)) and stop; bonus ~ p after the last draft. For any q,
  P(emit y) = min(p(y), q(y)) + (1 - sum_z min(p, q)(z)) * norm(max(0, p - q))(y) = p(y).
* Static tree, siblings drawn WITHOUT replacement from q (the number of children fixed by the layout; children
  outside q's support dropped, which depends on q only): recursive rejection sampling (SpecInfer, with the
  without-replacement correction of Jeon et al. 2024). Sibling i is a draw from q_i = q with siblings 1..i-1
  removed, renormalised; it is accepted with prob min(1, r_i(x)/q_i(x)), else r_{i+1} = norm(max(0, r_i - q_i));
  after the last sibling the token is drawn from the residual. The identity above, applied backwards from the
  last sibling, makes the emitted token p-distributed; the accepted child's subtree is verified the same way.
  This needs each node's number of children fixed before they are drawn, not chosen from the drawn values.
* Dynamic tree, children drawn without replacement: the i-th draw of a node is valued by the i-th LARGEST q of
  that node (proposer.draw_values), not by its own q, so whether it is kept depends only on earlier draws and
  other branches, never on itself or later draws: each kept sibling is still a draw from q_i. Valued by its own
  q, the selection would keep the likeliest draws and bias the output (tests/test_sampling_engine.py).
* Deterministic children (tree.draft_probs is None, e.g. greedy draft processors under a sampled target): the
  point-mass scheme, q_i = delta(x_i): accept with prob r_i(x_i), else r_{i+1} = r_i without x_i, renormalised.
  Each emitted token is p-distributed for ANY fixed set of children, however the tree was built or pruned.
  Round graphs run it as tensor ops over [T, K] (verify.point_mass_tests, point_mass_residual).

A seeded torch.Generator drives every random draw (drafting, acceptance, bonus): the same seed, prompt and
models give the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eaglespec.errors import EagleSpecError


@dataclass(frozen=True)
class SamplingParams:
    """The logits processors. temperature 0 = greedy; top_k 0 = off; top_p 1 = off; min_p 0 = off."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise EagleSpecError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise EagleSpecError(f"top-k must be >= 0 (0 = off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise EagleSpecError(f"top-p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise EagleSpecError(f"min-p must be in [0, 1], got {self.min_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return process_logits(logits, self)


@dataclass(frozen=True)
class SamplingConfig:
    """Target processors (verification + bonus), optional separate draft processors, and a seed.

    draft None = draft with the target's processors. seed None = a fresh random seed per call.
    """

    target: SamplingParams = SamplingParams()
    draft: SamplingParams | None = None
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.target.greedy

    @property
    def draft_params(self) -> SamplingParams:
        return self.draft if self.draft is not None else self.target

    def generator(self, device: torch.device | str = "cpu") -> torch.Generator:
        gen = torch.Generator(device=device)
        if self.seed is None:
            gen.seed()
        else:
            gen.manual_seed(int(self.seed))
        return gen


def draft_processors(temperature: float | None) -> SamplingParams | None:
    """SamplingConfig.draft for a drafter temperature (`--draft-temperature`, `draft_temperature=`): None keeps the
    target's processors; 0 drafts top-k children (the point-mass scheme). A negative one is one line naming it."""
    if temperature is None:
        return None
    if not float(temperature) >= 0:
        raise EagleSpecError(f"draft_temperature must be >= 0, got {temperature}")
    return SamplingParams(temperature=float(temperature))


def process_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[..., V] logits -> [..., V] float32 probabilities (temperature, top-k, top-p, min-p; HF order)."""
    x = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(x.argmax(-1), x.shape[-1]).float()
    x = x / params.temperature
    if 0 < params.top_k < x.shape[-1]:
        kth = x.topk(params.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))  # ties with the k-th value are kept (as HF)
    if params.top_p < 1.0:
        sorted_x, order = x.sort(dim=-1)  # ascending
        cum = sorted_x.softmax(-1).cumsum(-1)
        drop = cum <= 1 - params.top_p
        drop[..., -1].fill_(False)  # keep at least the top token
        x = x.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    if params.min_p > 0.0:
        p = x.softmax(-1)
        x = x.masked_fill(p < params.min_p * p.amax(-1, keepdim=True), float("-inf"))
    return x.softmax(-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One draw per row: probs [..., V] -> [...] long."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


def sample_without_replacement(probs: torch.Tensor, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """probs [B, V] -> [B, n] distinct tokens in DRAW ORDER (sequential draws without replacement).

    Exponential race (Efraimidis-Spirakis / Gumbel-top-k): sorting probs / Exp(1) in decreasing
    order gives the sequence of sequential without-replacement draws. n must not exceed the
    support size of any row (callers clamp with `(probs > 0).sum(-1).min()`).
    """
    race = exponential_noise(torch.empty_like(probs, dtype=torch.float32), generator)
    keys = probs.float() / race
    return keys.topk(n, dim=-1, sorted=True).indices


def exponential_noise(out: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Fill `out` with i.i.d. Exp(1) draws (one generator call), floored at the smallest normal float so
    a zero-probability token never wins a race (0 / 0 = nan would win an argmax)."""
    return out.exponential_(generator=generator).clamp_min_(torch.finfo(out.dtype).tiny)


def race_argmax(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """One categorical draw per row by the exponential race: argmax(probs / E), E ~ Exp(1) i.i.d.
    probs [..., V], noise [..., V] (exponential_noise) -> [...] long: P(i) = probs[i] / sum(probs)."""
    return (probs.float() / noise).argmax(-1)


def from_generation_config(gen_config, temperature: float | None = None, top_k: int | None = None,
                           top_p: float | None = None, min_p: float | None = None,
                           seed: int | None = None) -> SamplingConfig | None:
    """User options over the model's generation_config. None = greedy (the exact greedy path).

    With no user option the model's generation_config decides (do_sample, temperature, top_k,
    top_p, min_p). A user option switches sampling on; the options not given come from the
    generation_config when it samples, else are off. temperature 0 = greedy.
    """
    gc_samples = bool(getattr(gen_config, "do_sample", False)) if gen_config is not None else False

    def gc(name: str, off):
        value = getattr(gen_config, name, None) if gc_samples else None
        return off if value is None else value

    user = (temperature, top_k, top_p, min_p)
    if all(v is None for v in user) and not gc_samples:
        return None
    params = SamplingParams(
        temperature=float(gc("temperature", 1.0) if temperature is None else temperature),
        top_k=int(gc("top_k", 0) if top_k is None else top_k),
        top_p=float(gc("top_p", 1.0) if top_p is None else top_p),
        min_p=float(gc("min_p", 0.0) if min_p is None else min_p),
    )
    return None if params.greedy else SamplingConfig(params, seed=seed)
