"""eaglespec.kernels.onednn: F.linear's result through oneDNN on CPU (fp32, inference), F.linear wherever that does not apply;
the fast target and the drafters take it for every projection."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import eaglespec.kernels.onednn as onednn
from eaglespec.backends.fast import FastTarget

from conftest import tiny_drafter, tiny_target

pytestmark = pytest.mark.skipif(not onednn.available(), reason="no working oneDNN linear in this torch build")


@pytest.fixture
def counted(monkeypatch):
    """Count the oneDNN calls (each still runs the real op)."""
    assert onednn.available()  # the probe runs before the spy
    calls: list[tuple[int, ...]] = []
    real = onednn._onednn

    def spy(x2d, weight, bias):
        calls.append(tuple(weight.shape))
        return real(x2d, weight, bias)

    monkeypatch.setattr(onednn, "_onednn", spy)
    return calls


@pytest.mark.parametrize("shape", [(6,), (4, 6), (2, 3, 6)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_equals_f_linear(shape, with_bias, counted):
    g = torch.Generator().manual_seed(len(shape))
    x, w = torch.randn(shape, generator=g), torch.randn(5, 6, generator=g)
    b = torch.randn(5, generator=g) if with_bias else None
    y = onednn.linear(x, w, b)
    assert y.shape == (*shape[:-1], 5) and counted == [(5, 6)]
    torch.testing.assert_close(y, F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    xt = torch.randn(6, 4, generator=g).t()  # a non-contiguous input
    torch.testing.assert_close(onednn.linear(xt, w, b), F.linear(xt, w, b), rtol=1e-5, atol=1e-5)


def test_falls_back_where_onednn_does_not_apply(counted):
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 6, generator=g), torch.randn(5, 6, generator=g)
    wg = w.clone().requires_grad_()
    y = onednn.linear(x, wg)  # autograd needed: F.linear, with its gradient
    y.sum().backward()
    torch.testing.assert_close(wg.grad, x.sum(0).expand(5, 6))
    with torch.no_grad():
        onednn.linear(x, wg)  # no autograd: oneDNN
    assert len(counted) == 1
    onednn.linear(x.double(), w.double())  # not fp32
    onednn.linear(x, torch.randn(6, 5, generator=g).t())  # a non-contiguous weight
    assert len(counted) == 1


def test_a_failing_probe_means_f_linear(monkeypatch):
    onednn.available.cache_clear()
    try:
        def broken(*_a):
            raise RuntimeError("no oneDNN here")

        monkeypatch.setattr(onednn, "_onednn", broken)
        assert not onednn.available()
        x, w = torch.randn(2, 4), torch.randn(3, 4)
        assert torch.equal(onednn.linear(x, w), F.linear(x, w))  # not routed to the broken op
    finally:
        onednn.available.cache_clear()


def test_apply_keeps_hooks_and_subclasses(counted):
    lin = nn.Linear(6, 5)
    x = torch.randn(2, 6)
    with torch.no_grad():
        torch.testing.assert_close(onednn.apply(lin, x), lin(x), rtol=1e-5, atol=1e-5)
        assert len(counted) == 1
        seen = []
        handle = lin.register_forward_hook(lambda _m, _i, out: seen.append(out))
        onednn.apply(lin, x)
        handle.remove()

        class Scaled(nn.Linear):
            def forward(self, x):
                return 2 * super().forward(x)

        sub = Scaled(6, 5)
        torch.testing.assert_close(onednn.apply(sub, x), 2 * F.linear(x, sub.weight, sub.bias))
    assert len(seen) == 1 and len(counted) == 1  # the hooked and the subclassed calls ran the modules themselves


def test_fast_target_and_drafter_project_through_onednn(counted):
    """Every projection of a fast-target step (qkv, o, gate_up, down per layer, the lm_head) and of an EAGLE-3
    drafter step (fc, q/k/v/o, gate/up/down, the lm_head) runs the oneDNN op on CPU."""
    model = tiny_target("llama", seed=1)
    fast = FastTarget(model, (0, 2, 4), max_len=64)
    fast.forward(torch.arange(3, 8))
    assert len(counted) == 4 * fast.num_layers + 1
    counted.clear()
    drafter = tiny_drafter(model)
    with torch.no_grad():
        state = drafter.project(torch.randn(3, drafter.cfg.target_hidden_size * len(drafter.feature_layer_ids)))
        drafter(state, torch.tensor([4, 5, 6]), torch.arange(3), drafter.new_cache())
    assert len(counted) == 1 + 4 + 3 + 1  # project's fc, then q/k/v/o, gate/up/down and the lm_head


@pytest.mark.skipif(not onednn.packing_available(), reason="no packed oneDNN weights in this torch build")
@pytest.mark.parametrize("rows", [1, 3, 8, 20])
def test_a_packed_weight_gives_f_linear(rows, counted):
    """pack(): oneDNN's blocked layout, the same projection for any row count (fp32 rounding); with and without
    a bias, and through _add_linear's residual (the fast target's o and down projections)."""
    from eaglespec.backends.fast import _add_linear

    g = torch.Generator().manual_seed(rows)
    x, w, b = torch.randn(rows, 24, generator=g), torch.randn(40, 24, generator=g), torch.randn(40, generator=g)
    packed = onednn.pack(w)
    assert packed.is_mkldnn and tuple(packed.shape) == (40, 24) and onednn.applies(x, packed)
    for bias in (None, b):
        torch.testing.assert_close(onednn.linear(x, packed, bias), F.linear(x, w, bias), rtol=1e-5, atol=1e-5)
    h = torch.randn(rows, 40, generator=g)
    torch.testing.assert_close(_add_linear(h.clone(), x, packed, None, inplace=True), h + x @ w.T,
                               rtol=1e-5, atol=1e-5)
    assert len(counted) == 3


def test_pack_keeps_the_weight_where_it_does_not_apply(monkeypatch):
    w = torch.randn(5, 6)
    assert onednn.pack(w.double()) is not None and not onednn.pack(w.double()).is_mkldnn  # not fp32
    assert not onednn.pack(torch.randn(5)).is_mkldnn  # not 2-d
    monkeypatch.setattr(onednn, "_packed_probe", lambda: False)  # packing does not work here: the weight itself
    assert onednn.pack(w) is w
    monkeypatch.undo()
    monkeypatch.setattr(onednn, "available", lambda: False)  # oneDNN off: nothing is packed either
    assert onednn.pack(w) is w


@pytest.mark.skipif(not onednn.packing_available(), reason="no packed oneDNN weights in this torch build")
def test_fast_target_packs_its_projections_on_cpu(monkeypatch):
    """Every projection of the fast target's CPU step is packed (qkv, o, gate_up, down, the lm_head), and the
    logits of a several-row step equal those of the plain layout (packing unavailable) up to fp32 rounding."""
    model = tiny_target("llama", seed=1)
    fast = FastTarget(model, (0, 2), max_len=64)
    assert fast.lm_w.is_mkldnn
    assert all(w.is_mkldnn for layer in fast.layers for w in (layer.qkv_w, layer.o_w, layer.gate_up_w, layer.down_w))
    monkeypatch.setattr(onednn, "packing_available", lambda: False)
    plain = FastTarget(model, (0, 2), max_len=64)
    assert not plain.lm_w.is_mkldnn and plain.lm_w is model.get_output_embeddings().weight
    for t in (fast, plain):
        t.forward(torch.arange(3, 9))
        t.commit(torch.arange(6))
    a, b = fast.forward(torch.arange(20, 25)), plain.forward(torch.arange(20, 25))
    torch.testing.assert_close(a.logits, b.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a.features, b.features, rtol=1e-5, atol=1e-5)


def test_affordable_reads_available_memory(tmp_path):
    info = tmp_path / "meminfo"
    info.write_text("MemTotal:       16000000 kB\nMemAvailable:    4000000 kB\n")
    assert onednn.affordable(1_000_000_000, str(info)) and not onednn.affordable(3_000_000_000, str(info))
    assert onednn.affordable(10**15, str(tmp_path / "missing"))  # unknown: allowed
    info.write_text("MemTotal: 1 kB\n")
    assert onednn.affordable(10**15, str(info))


@pytest.mark.skipif(not onednn.packing_available(), reason="no packed oneDNN weights in this torch build")
def test_fast_target_skips_the_packed_copies_without_the_memory(monkeypatch):
    """Short of memory for the copies packing adds (lm_head, down: the model keeps its own), those two stay the
    model's weights; qkv, o and gate/up, FastTarget's own copies anyway, are still packed."""
    monkeypatch.setattr(onednn, "affordable", lambda nbytes: False)
    model = tiny_target("llama", seed=1)
    fast = FastTarget(model, (0, 2), max_len=64)
    assert fast.lm_w is model.get_output_embeddings().weight
    layers = model.model.layers
    assert all(w.down_w is layer.mlp.down_proj.weight for w, layer in zip(fast.layers, layers))
    assert all(w.qkv_w.is_mkldnn and w.o_w.is_mkldnn and w.gate_up_w.is_mkldnn for w in fast.layers)
