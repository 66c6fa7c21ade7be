"""The PDL switch (target/kernels.pdl, EAGLESPEC_PDL): off unless asked, never under the interpreter or on CPU, a bad
value refused in one line; and the rule every kernel launched with it obeys, checked in the source: a USE_GDC
parameter, _wait(USE_GDC) before the first load of anything but a weight and before any store, launch_pdl passed at
every launch. PDL itself needs an sm90 GPU: bench/ab.py checks there that it changes no token."""

from __future__ import annotations

import ast
import inspect
from types import SimpleNamespace

import pytest
import torch

from eaglespec.errors import EagleSpecError
from eaglespec.target import attn_kernels, kernels, skinny

# kernel -> the weight pointers it may load before its wait (kernels.pdl's rule)
PREFETCHED = {"_rms_norm_weight_kernel": {"w_ptr"}, "_eagle3_input_kernel": {"in_w_ptr", "hid_w_ptr"},
              "_skinny_kernel": {"w_cols"}}


def test_switch_is_on_for_sm90_cuda_unless_0_and_never_on_cpu(monkeypatch):
    t = torch.zeros(1)
    monkeypatch.delenv(kernels.PDL_ENV, raising=False)
    assert kernels.pdl(t) is False  # a CPU tensor: no griddepcontrol
    monkeypatch.setenv(kernels.PDL_ENV, "1")
    assert kernels.pdl(t) is False
    monkeypatch.setenv(kernels.PDL_ENV, "2")
    with pytest.raises(EagleSpecError, match="EAGLESPEC_PDL='2'"):
        kernels.pdl(t)
    # a CUDA tensor stand-in, outside the interpreter
    cuda = SimpleNamespace(is_cuda=True, device=torch.device("cuda", 0))
    monkeypatch.setattr(kernels, "_interpreted", lambda: False)
    capability = {"hopper": True}
    monkeypatch.setattr(kernels, "_hopper_or_later", lambda index: capability["hopper"])
    monkeypatch.delenv(kernels.PDL_ENV, raising=False)
    assert kernels.pdl(cuda) is True  # the default on sm90+
    monkeypatch.setenv(kernels.PDL_ENV, "0")
    assert kernels.pdl(cuda) is False
    monkeypatch.setenv(kernels.PDL_ENV, "1")
    capability["hopper"] = False
    assert kernels.pdl(cuda) is False  # before Hopper: no griddepcontrol, even when asked


def _kernel_functions(module):
    tree = ast.parse(inspect.getsource(module))
    return [f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name.endswith("_kernel")]


def _first_line(fn: ast.FunctionDef, pred) -> int | None:
    lines = [n.lineno for n in ast.walk(fn) if pred(n)]
    return min(lines) if lines else None


def _call_to(name: str):
    def pred(n):
        if not isinstance(n, ast.Call):
            return False
        f = n.func
        return (isinstance(f, ast.Name) and f.id == name) or (isinstance(f, ast.Attribute) and f.attr == name)
    return pred


@pytest.mark.parametrize("module", [kernels, attn_kernels, skinny], ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_every_kernel_waits_before_reading_activations_or_storing(module):
    fns = _kernel_functions(module)
    assert fns
    for fn in fns:
        assert "USE_GDC" in [a.arg for a in fn.args.args], fn.name
        wait = _first_line(fn, _call_to("_wait"))
        assert wait is not None, f"{fn.name}: no _wait(USE_GDC)"
        store = _first_line(fn, _call_to("store"))
        assert store is None or store > wait, f"{fn.name}: a store before the wait"
        allowed = PREFETCHED.get(fn.name, set())
        for node in ast.walk(fn):
            if _call_to("load")(node) and node.lineno < wait:
                names = {n.id for n in ast.walk(node.args[0]) if isinstance(n, ast.Name)}
                assert names & allowed, f"{fn.name} line {node.lineno}: loads {names} before the wait"


@pytest.mark.parametrize("module", [kernels, attn_kernels, skinny], ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_every_launch_passes_the_switch(module):
    tree = ast.parse(inspect.getsource(module))
    launches = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Subscript)
                and isinstance(n.func.value, ast.Name) and n.func.value.id.endswith("_kernel")]
    assert launches
    for call in launches:
        kw = {k.arg for k in call.keywords}
        assert {"USE_GDC", "launch_pdl"} <= kw, f"{module.__name__}: {call.func.value.id} at line {call.lineno}"
