"""Worker for test_train_ddp: `torchrun --nproc_per_node 2 tests/train_ddp_worker.py OUT PAUSED CLOCKS` (gloo, CPU).

OUT: a whole 3-step run; PAUSED: the same run paused (checkpoint written) after 2 steps, for a 1-process resume;
CLOCKS: the whole run again with a pause time that rank 1 passes at once and rank 0 never (rank 0 decides: no pause).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from eaglespec.train.trainer import TrainConfig, finish_distributed, init_distributed, train
from train_helpers import greedy_samples, sharp_target


def config(grad_accum: int) -> TrainConfig:
    return TrainConfig(steps=3, batch_size=2, grad_accum=grad_accum, lr=3e-3, ttt_steps=2, draft_vocab=80,
                       progress=False, eval_fraction=0.0, log_every=0)


def data():
    model = sharp_target()
    return model, greedy_samples(model, 12, new=8, seed=4)


if __name__ == "__main__":
    torch.set_num_threads(1)
    init_distributed("cpu")
    model, samples = data()
    train(model, samples, config(grad_accum=1), sys.argv[1])
    train(model, samples, config(grad_accum=1), sys.argv[2], pause_after=2)
    rank = torch.distributed.get_rank()
    train(model, samples, config(grad_accum=1), sys.argv[3], pause_after_s=1e9 if rank == 0 else 1e-9)
    finish_distributed()
