"""finish_distributed really tears a gloo group down: its threads are gone before the interpreter exits.

torch.distributed.nn.functional, imported after init_process_group (building an HF model does it, via
torch.distributed.checkpoint), keeps the default group as a default argument; destroy_process_group alone then
leaves gloo's worker threads running into interpreter exit, where a rank could abort ("terminate called
without an active exception"). Runs in a subprocess (one gloo rank, world size 1) to keep this process clean."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs /proc thread names (Linux)")

SCRIPT = textwrap.dedent("""
    import os, sys
    import torch
    import torch.distributed as dist
    from eaglespec.train.trainer import finish_distributed

    def gloo_threads():
        names = []
        for t in os.listdir("/proc/self/task"):
            try:
                names.append(open(f"/proc/self/task/{t}/comm").read().strip())
            except OSError:
                pass
        return sorted(n for n in names if "gloo" in n)

    dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:" + sys.argv[1])
    import torch.distributed.nn.functional  # noqa: F401  (pins the default group, as building an HF model does)
    t = torch.ones(4)
    dist.all_reduce(t)
    print("running:", gloo_threads())
    {teardown}
    print("after:", gloo_threads())
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _threads(teardown: str, may_abort: bool = False) -> tuple[str, str]:
    """(gloo threads running, gloo threads left after `teardown`). may_abort: the process may abort at exit with
    threads left running (SIGABRT, "terminate called without an active exception"), the failure itself."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", SCRIPT.replace("{teardown}", teardown), str(_free_port())], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 or (may_abort and proc.returncode == -6), proc.stderr[-3000:]
    lines = dict(line.split(": ", 1) for line in proc.stdout.splitlines() if ": " in line)
    return lines["running"], lines["after"]


def test_finish_distributed_joins_gloo_threads():
    running, after = _threads("finish_distributed()")
    assert "pt_gloo_runloop" in running  # the check below can see them
    assert after == "[]", after


def test_destroy_process_group_alone_leaves_them():
    """The failure finish_distributed guards against: destroy_process_group alone leaves the gloo threads running
    (should a torch release change that, this test fails and finish_distributed's unpinning can go)."""
    running, after = _threads("dist.destroy_process_group()", may_abort=True)
    assert "pt_gloo_runloop" in running and "pt_gloo_runloop" in after, (running, after)
