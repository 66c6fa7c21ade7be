"""tau at T=1 for static trees: sampled children with real q vs top-k children with point mass (issue 4).

Same target, drafter, prompts and seeds through the real SpeculativeEngine; the top-k variant is the
previous behaviour (greedy drafting under sampling: top-k children, draft_probs None, point mass).
Target: tests' `sharp_target` (tiny Llama, vocab 16, logits x3); drafter: tests' tiny_drafter(seed=1),
as is and with its head x8 (a peaked q that disagrees with p).

    .venv/bin/python bench/static_sampled_tau.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from eaglespec.engine.loop import SpeculativeEngine
from eaglespec.sampling import SamplingConfig, SamplingParams
from eaglespec.backends.hf import HFTarget
from eaglespec.tree.core import TreeSpec

from conftest import tiny_drafter, tiny_target

V, PROMPTS, SEEDS, NEW = 16, 8, 8, 32


class TopKEngine(SpeculativeEngine):
    """Static trees as before this change: deterministic top-k children, point-mass verification."""

    def _begin_sampling(self, sampling, dev):
        super()._begin_sampling(sampling, dev)
        self.proposer.sampling = None


def tau(engine_cls, target, drafter, spec, prompts) -> tuple[float, float]:
    engine = engine_cls(HFTarget(target), drafter, spec)
    emitted = rounds = accepted = 0
    for prompt in prompts:
        for seed in range(SEEDS):
            out = engine.generate(prompt, NEW, sampling=SamplingConfig(SamplingParams(temperature=1.0), seed=seed))
            emitted += len(out.token_ids) - 1
            rounds += len(out.rounds)
            accepted += sum(r.accepted for r in out.rounds)
    return emitted / rounds, accepted / rounds


def main() -> None:
    torch.set_num_threads(2)
    target = tiny_target("llama", seed=5, vocab=V, layers=2)
    with torch.no_grad():
        target.lm_head.weight.mul_(3.0)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, V, (4,), generator=gen).tolist() for _ in range(PROMPTS)]
    for depth in (3, 5):
        spec = TreeSpec("static", depth=depth, budget=60)  # MC_SIM_7B_63 cut to `depth`
        for scale in (1.0, 8.0):
            drafter = tiny_drafter(target, seed=1)
            with torch.no_grad():
                drafter.lm_head.weight.mul_(scale)
            t_s, a_s = tau(SpeculativeEngine, target, drafter, spec, prompts)
            t_k, a_k = tau(TopKEngine, target, drafter, spec, prompts)
            nodes = len(spec.static_choices())
            print(f"static depth {depth} ({nodes} drafts), drafter head x{scale:g}: tau sampled/real-q {t_s:.3f} "
                  f"vs top-k/point-mass {t_k:.3f} (accepted per round {a_s:.3f} vs {a_k:.3f})", flush=True)


if __name__ == "__main__":
    main()
