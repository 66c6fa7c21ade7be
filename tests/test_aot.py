"""eaglespec.kernels.aot: the sampled sibling-test kernels and the greedy round's top-k, argmax and acceptance kernels
compile for sm_90 with Triton's real compiler and ptxas on a machine without a GPU (the interpreter the kernel tests
use accepts code the compiler refuses). In a subprocess: the other kernel tests set TRITON_INTERPRET=1 for their
whole process."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# not imported here: triton imported before the kernel tests set TRITON_INTERPRET=1 breaks their interpreter runs
pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")

SRC = Path(__file__).resolve().parents[1] / "src"
COMPILE = ("import json, sys; from eaglespec.kernels.aot import compile_round_kernels; "
           "json.dump(compile_round_kernels(90), open(sys.argv[1], 'w'))")


def test_kernels_compile_for_sm90(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=str(SRC), TRITON_CACHE_DIR=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-c", COMPILE, str(tmp_path / "aot.json")],
                         env=env, capture_output=True, text=True, timeout=600)
    if out.returncode and "ptxas" in out.stderr and "not found" in out.stderr.lower():
        pytest.skip("this triton has no ptxas")
    assert out.returncode == 0, out.stderr[-2000:]
    rows = json.loads((tmp_path / "aot.json").read_text())
    compiled = {(r["kernel"], r["K"]) for r in rows}
    sampled = {(name, k) for name in ("_left_kernel", "_rank_kernel", "_final_kernel") for k in (4, 12)}
    greedy = {(f"{name} ({chunk})", 10) for name in ("_chunk_top_kernel", "_merge_top_kernel") for chunk in (1024, 256)}
    greedy |= {("_argmax_chunk_kernel", 1), ("_accept_path_kernel", 1), ("_accept_path_kernel (keys)", 24)}
    assert compiled == sampled | greedy
    assert all(r["cubin_bytes"] > 0 and r["ptx_instructions"] > 100 for r in rows)


def test_the_interpreter_is_refused(monkeypatch):
    from eaglespec.errors import EagleSpecError
    from eaglespec.kernels.aot import compile_round_kernels

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(EagleSpecError, match="TRITON_INTERPRET=1"):
        compile_round_kernels(90)
