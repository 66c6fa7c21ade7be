"""Count dispatched aten ops and CPU time of one EAGLE-3 training step (8 packs, 7 TTT steps).

Usage: python bench/train_opcount.py [REPO_ROOT]   (REPO_ROOT defaults to this checkout; point it at a
`git worktree` of another commit to compare).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).resolve().parents[1])
sys.path[:0] = [ROOT + "/src", ROOT + "/tests"]

from eaglespec.train.trainer import TrainConfig, Trainer, new_drafter  # noqa: E402
from train_helpers import greedy_samples, sharp_target  # noqa: E402


class Count(TorchDispatchMode):
    n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        Count.n += 1
        return func(*args, **(kwargs or {}))


def main() -> None:
    torch.set_num_threads(1)
    model = sharp_target()
    cfg = TrainConfig(steps=4, batch_size=4, lr=3e-3, ttt_steps=7, progress=False, eval_fraction=0.0, log_every=0)
    trainer = Trainer(model, new_drafter(model, "eagle3", None, seed=0), cfg)
    samples = greedy_samples(model, 16, new=24)
    preps = trainer.prepare_many([samples[i:i + 2] for i in range(0, 16, 2)])  # 8 packs
    counts = torch.stack([p.sup.sum(1) for p in preps]).sum(0).float()
    batched = "batched" in (trainer.micro_loss.__doc__ or "")

    def step() -> None:
        for part in [preps] if batched else preps:
            loss, _ = trainer.micro_loss(part, counts)
            loss.backward()

    step()
    with Count():
        step()
    t0 = time.perf_counter()
    for _ in range(5):
        step()
    ms = 1000 * (time.perf_counter() - t0) / 5
    print(f"{ROOT}: aten ops per step (8 packs, 7 TTT steps, fwd+bwd): {Count.n} | CPU {ms:.0f} ms/step")


if __name__ == "__main__":
    main()
