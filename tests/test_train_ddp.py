"""Data parallel training: a 2-process torchrun (gloo, CPU) run equals one process with 2x accumulation, and a
2-process run paused after 2 steps resumes in one process (2x accumulation) to the same drafter; a time pause
follows rank 0's clock on every rank."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from eaglespec.checkpoint.drafter import load_drafter
from eaglespec.train.trainer import TrainConfig, train
from train_ddp_worker import config, data


def test_torchrun_two_processes_match_single(tmp_path):
    worker = Path(__file__).with_name("train_ddp_worker.py")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(worker), str(tmp_path / "ddp"), str(tmp_path / "paused"), str(tmp_path / "clocks")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    # No retry: "terminate called without an active exception" at exit comes from gloo threads left running
    # into interpreter exit, which finish_distributed joins (test_train_ddp_teardown.py checks that).
    assert proc.returncode == 0, proc.stderr[-3000:]
    model, samples = data()
    single = train(model, samples, config(grad_accum=2), tmp_path / "single")
    ddp = load_drafter(tmp_path / "ddp", target_num_layers=4)
    one = load_drafter(tmp_path / "single", target_num_layers=4)
    init = train(model, samples, TrainConfig(**{**config(2).to_dict(), "steps": 0}))  # the untrained drafter
    for name, ref in one.state_dict().items():
        torch.testing.assert_close(ddp.state_dict()[name], ref, atol=2e-5, rtol=1e-4, msg=name)
    changed = [n for n, v in one.state_dict().items() if v.is_floating_point()
               and not torch.equal(v, init.drafter.state_dict()[n].to(v.dtype))]
    assert changed and single.steps == 3 and len(single.history) == 3
    assert ddp.manifest["hyperparameters"]["world_size"] == 2 and one.manifest["hyperparameters"]["world_size"] == 1
    clocks = load_drafter(tmp_path / "clocks", target_num_layers=4)
    assert clocks.manifest["trained_steps"] == 3
    assert all(torch.equal(clocks.state_dict()[n], v) for n, v in ddp.state_dict().items())
    paused = load_drafter(tmp_path / "paused", target_num_layers=4)
    assert paused.manifest["trained_steps"] == 2
    assert not all(torch.equal(paused.state_dict()[n], v) for n, v in one.state_dict().items())
    resumed = train(model, samples, config(grad_accum=2), tmp_path / "paused", resume=True)
    assert resumed.steps == 3 and [m["step"] for m in resumed.history] == [3]
    for name, ref in one.state_dict().items():
        torch.testing.assert_close(resumed.drafter.state_dict()[name].cpu(), ref, atol=2e-5, rtol=1e-4, msg=name)
