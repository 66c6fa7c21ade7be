"""The fast static-cache backend equals the HF reference backend (fp32, CPU, eager path)."""

from __future__ import annotations

import pytest
import torch

from eaglespec.backends.fast import FastTarget, unsupported_reason
from eaglespec.backends.hf import HFTarget
from eaglespec.engine.loop import SpeculativeEngine
from eaglespec.errors import EagleSpecError
from eaglespec.tree.core import TreeSpec, ancestry

from conftest import reference_greedy, tiny_drafter, tiny_target

ATOL = 1e-5


def _close(a, b) -> None:
    assert a.logits.shape == b.logits.shape and a.features.shape == b.features.shape
    torch.testing.assert_close(a.logits, b.logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(a.features, b.features, atol=ATOL, rtol=0)


def _pair(arch: str, ids=(0, 2, 4), **fast_kw):
    model = tiny_target(arch, seed=5)
    return HFTarget(model, ids), FastTarget(model, ids, **fast_kw)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
def test_tree_forward_and_commits_match_hf(arch):
    """Prefill, a tree verify, a NON-prefix commit, another tree, a prefix commit, a plain step."""
    ref, fast = _pair(arch, max_len=64)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, 90, (13,), generator=gen)
    _close(ref.forward(prompt), fast.forward(prompt))
    for b in (ref, fast):
        b.commit(torch.arange(13))
    parents = torch.tensor([-1, 0, 0, 1, 1, 2, 3, 6, 2])
    depths = torch.tensor([0, 1, 1, 2, 2, 2, 3, 4, 2])
    vis = ancestry(parents)
    toks = torch.randint(3, 90, (9,), generator=gen)
    _close(ref.forward(toks, depths, vis), fast.forward(toks, depths, vis))
    keep = torch.tensor([0, 1, 3, 6, 7])  # a non-prefix path: rows 2, 4, 5, 8 are dropped
    for b in (ref, fast):
        b.commit(keep)
    assert ref.committed_len == fast.committed_len == 18
    toks = torch.randint(3, 90, (5,), generator=gen)
    _close(ref.forward(toks, depths[:5], vis[:5, :5]), fast.forward(toks, depths[:5], vis[:5, :5]))
    for b in (ref, fast):
        b.commit(torch.tensor([0, 1]))
    one = torch.randint(3, 90, (1,), generator=gen)
    _close(ref.forward(one), fast.forward(one))


def test_matches_a_plain_forward_of_the_accepted_sequence():
    """After a non-prefix commit the cache must equal that of the accepted tokens fed plainly."""
    model = tiny_target("llama", seed=2)
    fast = FastTarget(model, (1, 4), max_len=64)
    plain = FastTarget(model, (1, 4), max_len=64)
    prompt = torch.tensor([5, 9, 11, 40, 7])
    fast.forward(prompt)
    fast.commit(torch.arange(5))
    toks = torch.tensor([8, 30, 31, 50, 51])
    parents = torch.tensor([-1, 0, 0, 2, 1])
    fast.forward(toks, torch.tensor([0, 1, 1, 2, 2]), ancestry(parents))
    fast.commit(torch.tensor([0, 2, 3]))  # the path 8 -> 31 -> 50
    accepted = torch.tensor([5, 9, 11, 40, 7, 8, 31, 50])
    plain.forward(accepted)
    plain.commit(torch.arange(8))
    nxt = torch.tensor([12, 13])
    _close(plain.forward(nxt), fast.forward(nxt))


def test_prefill_beyond_buckets_and_cache_growth():
    """The eager (unbucketed) path and a reallocation that must keep the committed prefix."""
    ref, fast = _pair("qwen3", buckets=(1, 4), max_len=8)
    prompt = torch.randint(3, 90, (30,), generator=torch.Generator().manual_seed(1))
    _close(ref.forward(prompt), fast.forward(prompt))  # 30 > 4: eager, grows the cache 64 -> ...
    for b in (ref, fast):
        b.commit(torch.arange(30))
    for _ in range(15):  # grows past the first allocation (64 slots) while committed rows must survive
        tok = torch.randint(3, 90, (3,))
        _close(ref.forward(tok), fast.forward(tok))
        for b in (ref, fast):
            b.commit(torch.tensor([0, 1, 2]))
    assert fast.max_len >= fast.committed_len == 75 and fast.max_len > 64


def test_feature_layer_ids_include_last_layer_and_order():
    model = tiny_target("llama", seed=3)
    fast = FastTarget(model, (4, 0, 2))
    ref = HFTarget(model, (4, 0, 2))
    prompt = torch.tensor([3, 4, 5, 6])
    a, b = ref.forward(prompt), fast.forward(prompt)
    _close(a, b)
    hs = model(prompt[None], output_hidden_states=True).hidden_states
    last = model.lm_head(model.model.norm(b.features[:, :32]))  # id L = last layer output, pre final norm
    torch.testing.assert_close(last, b.logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(b.features[:, 32:64], hs[0][0], atol=ATOL, rtol=0)  # id 0 = embedding
    torch.testing.assert_close(b.features[:, 64:], hs[2][0], atol=ATOL, rtol=0)  # entering layer 2


def test_dropping_the_captured_steps_drops_their_pool():
    """A CUDA graph pool whose graphs are all freed takes no new capture (torch asserts use_count > 0, e.g. after
    the target's feature layers change), so whatever drops the captured steps (new
    feature layers, a cache reallocation) drops the pool handle too; unchanged feature layers keep both."""
    fast = FastTarget(tiny_target("llama", seed=3), (0, 2), buckets=(1, 4), max_len=8)
    for change in (lambda: fast.set_feature_layers((0, 2)), lambda: fast.set_feature_layers((4,)),
                   lambda: fast.reserve(300)):
        fast.reset()
        fast.forward(torch.tensor([3, 4, 5]))  # bucket 4: one step runner
        pool = fast._pool = object()  # stands for torch.cuda.graph_pool_handle()
        kept = (fast.feature_layer_ids, fast.max_len)
        change()
        if (fast.feature_layer_ids, fast.max_len) == kept:
            assert fast._graphs and fast._pool is pool
        else:
            assert not fast._graphs and fast._pool is None


@pytest.mark.parametrize("k", [0, 3])
def test_greedy_engine_with_fast_backend_matches_generate(arch, k):
    model = tiny_target(arch, seed=7)
    engine = SpeculativeEngine(FastTarget(model, max_len=64), tiny_drafter(model, seed=k),
                               TreeSpec("chain", depth=k))
    gen = torch.Generator().manual_seed(11 + k)
    for _ in range(2):
        prompt = torch.randint(3, 90, (int(torch.randint(1, 10, (1,), generator=gen)),), generator=gen).tolist()
        out = engine.generate(prompt, max_new_tokens=20)
        assert out.backend == "fast"
        assert out.token_ids == reference_greedy(model, prompt, 20)


def test_unsupported_models_are_refused():
    import transformers as tf

    cfg = tf.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50)
    model = tf.GPT2LMHeadModel(cfg)
    assert "gpt2" in unsupported_reason(model)
    with pytest.raises(EagleSpecError, match="fast backend"):
        FastTarget(model)


def test_staging_reuses_buckets_without_stale_inputs():
    """One bucket (4 rows) serves causal steps of 1-4 rows and trees in turn: every switch must
    restage the positions, the base and the mask (a causal pattern left over from another t, a tree
    mask left over in a causal step, padding rows holding older tokens), and commits that keep every
    pending row (moved nothing) or a subset (gathered) must leave the same cache as HF's."""
    ref, fast = _pair("llama", buckets=(4,), max_len=64)
    gen = torch.Generator().manual_seed(3)
    prompt = torch.randint(3, 90, (6,), generator=gen)
    _close(ref.forward(prompt), fast.forward(prompt))  # 6 > 4: the eager path
    for b in (ref, fast):
        b.commit(torch.arange(6))
    tree_vis = ancestry(torch.tensor([-1, 0, 0]))
    steps = [  # (rows, depths, visible, keep)
        (4, None, None, [0, 1, 2, 3]),  # causal, no padding, all kept
        (3, None, None, [0, 1, 2]),  # causal of 3 rows: row 3 pads and holds an older token
        (3, torch.tensor([0, 1, 1]), tree_vis, [0, 2]),  # a tree right after a causal step, subset kept
        (3, None, None, [0, 1]),  # causal of 3 rows right after the tree (no stale tree mask)
        (3, None, None, [0, 1, 2]),  # the same causal pattern again (the mask copy is skipped)
        (2, None, None, [0, 1]),  # causal of 2 rows (no stale 3-row pattern)
        (1, None, None, [0]),  # one row: plain decoding
        (3, torch.tensor([0, 1, 1]), tree_vis, [0]),  # the root only
        (2, None, None, [0, 1]),
    ]
    for t, depths, vis, keep in steps:
        toks = torch.randint(3, 90, (t,), generator=gen)
        _close(ref.forward(toks, depths, vis), fast.forward(toks, depths, vis))
        for b in (ref, fast):
            b.commit(torch.tensor(keep))
    assert ref.committed_len == fast.committed_len
    toks = torch.randint(3, 90, (4,), generator=gen)
    _close(ref.forward(toks), fast.forward(toks))



@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_attention_spans_cross_boundaries(arch):
    """Steps attend over the first span slots only (committed + bucket rounded up to span_step): every
    step whose rows cross a span boundary must still see the whole prefix and its own rows (a span taken
    from the committed length alone, or rounded down, drops them), trees and non-prefix commits included."""
    ref, fast = _pair(arch, buckets=(1, 4, 8), max_len=64, span_step=4)
    gen = torch.Generator().manual_seed(7)
    prompt = torch.randint(3, 90, (5,), generator=gen)  # bucket 8: a bucketed step, not the eager prefill
    _close(ref.forward(prompt), fast.forward(prompt))
    for b in (ref, fast):
        b.commit(torch.arange(5))
    tree_vis = ancestry(torch.tensor([-1, 0, 0, 1, 2]))
    tree_depths = torch.tensor([0, 1, 1, 2, 2])
    for step in range(14):
        if step % 3 == 2:  # a tree of 5 rows (bucket 8), a non-prefix path kept
            toks = torch.randint(3, 90, (5,), generator=gen)
            _close(ref.forward(toks, tree_depths, tree_vis), fast.forward(toks, tree_depths, tree_vis))
            keep = torch.tensor([0, 2, 4])
        else:  # causal steps of 1-3 rows
            t = 1 + step % 3
            toks = torch.randint(3, 90, (t,), generator=gen)
            _close(ref.forward(toks), fast.forward(toks))
            keep = torch.arange(t)
        for b in (ref, fast):
            b.commit(keep)
    spans = {span for _, span in fast._graphs}
    assert len(spans) >= 4 and max(spans) < fast.max_len  # several spans, none the whole cache
    assert fast.span(fast.committed_len + 1) == -(-(fast.committed_len + 1) // 4) * 4


def test_span_rounds_up_to_span_step_and_is_capped_by_the_cache():
    model = tiny_target("llama", seed=1)
    assert FastTarget(model, max_len=64, span_step=16).span(3) == 16
    assert FastTarget(model, max_len=64, span_step=16, compile=True).span(17) == 32  # compiled steps too
    assert FastTarget(model, max_len=64).span(3) == 64  # default span_step 256 > the cache
    assert FastTarget(model, max_len=1024, span_step=256).span(257) == 512
    with pytest.raises(EagleSpecError, match="span_step"):
        FastTarget(model, max_len=64, span_step=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("impl", ["target", "drafter"])
def test_rms_norm_rounds_like_hf(dtype, impl):
    """The fast backend's and the drafters' RMSNorm must round as HF LlamaRMSNorm does: fp32 statistics and
    product, one cast to the model's dtype, then the weight in that dtype (scaling before the cast would round
    differently)."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from eaglespec.backends.fast import _rms
    from eaglespec.draft.layers import RMSNorm

    gen = torch.Generator().manual_seed(0)
    norm = LlamaRMSNorm(96, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(96, generator=gen) * 2)
    norm = norm.to(dtype)
    x = (torch.randn(16, 96, generator=gen) * 7).to(dtype)
    if impl == "target":
        assert torch.equal(_rms(x, norm.weight, 1e-5), norm(x))
    else:
        ours = RMSNorm(96, eps=1e-5).to(dtype)
        ours.load_state_dict(norm.state_dict())
        assert torch.equal(ours(x), norm(x))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_rope_equals_hf_for_any_layout(dtype):
    """_rope (one product with the [[cos_1, -sin_1], [sin_2, cos_2]] table, then a sum over the pair) must give
    HF's apply_rotary_pos_emb bitwise, for a strided input (q/k are views of the fused qkv output) and a
    head-major `out` (swapped halves, a sign on the wrong half or a product rounded differently all differ)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    from eaglespec.backends.fast import _rope, _rope_table

    gen = torch.Generator().manual_seed(0)
    b, h, d = 5, 6, 16
    qkv = (torch.randn(b, h + 2, d, generator=gen) * 3).to(dtype)
    x = qkv[:, :h]  # [B, H, D], not contiguous
    angles = torch.rand(b, d // 2, generator=gen).repeat(1, 2) * 50
    angles[:, d // 2:] += 0.1  # distinct halves: a table built from the wrong half differs
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    table = _rope_table(cos, sin)  # [B, 2, 2, D/2]
    ref, _ = apply_rotary_pos_emb(x.transpose(0, 1), x.transpose(0, 1), cos, sin, unsqueeze_dim=0)  # [H, B, D]
    assert torch.equal(_rope(x, table[:, None]), ref.transpose(0, 1))
    heads = torch.empty(h, b, d, dtype=dtype)
    _rope(x.transpose(0, 1), table[None], out=heads)
    assert torch.equal(heads, ref)


def test_add_linear_keeps_bias_path_and_matches_without_bias():
    from eaglespec.backends.fast import _add_linear

    gen = torch.Generator().manual_seed(0)
    h, x = torch.randn(4, 8, generator=gen), torch.randn(4, 6, generator=gen)
    w, bias = torch.randn(8, 6, generator=gen), torch.randn(8, generator=gen)
    torch.testing.assert_close(_add_linear(h, x, w, bias), h + torch.nn.functional.linear(x, w, bias), atol=1e-6,
                               rtol=0)  # on CPU through oneDNN (eaglespec.kernels.onednn): summation order only
    torch.testing.assert_close(_add_linear(h, x, w, None), h + x @ w.T, atol=1e-6, rtol=0)
    h2 = h.clone()
    assert _add_linear(h2, x, w, None, inplace=True) is h2  # in place, on either path


@pytest.mark.parametrize("rows", [1, 4])
def test_step_copies_only_the_grouped_queries(rows, without_onednn):
    """Kernel-count guard (torch path): k reaches the cache as a view of the head-major rope output, q is copied
    once into the grouped layout [B, G, Hkv, D], and the attention output reaches o_proj as a view (SDPA returns
    it in the query's BMHK memory): one copy per layer whatever the number of rows, none of the attention output
    (the fused rope writes q in that layout: no copy at all); rope in 2 ops (no roll: on CUDA it copies a
    non-contiguous input first) and one GEMM per residual."""
    from _opcount import HostOps

    model = tiny_target("llama", seed=1)
    fast = FastTarget(model, max_len=64, buckets=(rows,))
    fast.forward(torch.arange(3, 8))
    fast.commit(torch.arange(5))
    fast.forward(torch.arange(10, 10 + rows))  # stages the bucket's buffers
    (run,) = fast._graphs.values()
    with HostOps() as c, torch.no_grad():
        fast.step(run.tokens, run.positions, run.visible, run.base, run.cols)
    ops, layers = c.kernels, fast.num_layers
    assert ops["aten.clone.default"] + ops["aten.copy_.default"] == layers  # q into the grouped layout
    assert not any("roll" in op or "flip" in op for op in ops)
    assert ops["aten.sum.IntList_out"] == layers  # the rope's pair sums
    assert ops["aten.addmm_.default"] == 2 * layers  # in place: an out-of-place addmm copies h first on CUDA
    assert ops["aten.addmm.default"] == 0
    assert ops["aten.add.Tensor"] == 1  # the slots: no residual add left


def test_grouped_attention_layout_and_o_weight():
    """The grouped GQA layout (fast.py's module docstring) against a per-head reference: rows t*G + r of kv head j
    are HF head j*G + r of token t, the mask rows follow the tokens, the output's [B, Hq*D] view in (r, j, d) order
    times _grouped_o_weight equals HF's o_proj of the head-ordered output, and that view is free (no copy) when
    the SDPA output is in BMHK memory (CUDA's attention kernels), G != Hkv so a swapped (r, j) shows."""
    from eaglespec.backends.fast import _grouped_mask, _grouped_o_weight, _grouped_output, _grouped_queries

    gen = torch.Generator().manual_seed(0)
    b, g, hk, d, span, hidden = 3, 3, 2, 4, 7, 10
    hq = g * hk
    q_heads = torch.randn(b, hq, d, generator=gen)  # HF's per-token heads, head h = j*G + r
    k, v = torch.randn(hk, span, d, generator=gen), torch.randn(hk, span, d, generator=gen)
    allowed = torch.rand(b, span, generator=gen) < 0.7
    allowed[:, 0] = True
    w = torch.randn(hidden, hq * d, generator=gen)
    # reference: each head on its own, its kv head repeated (HF's repeat_kv), then o_proj in HF's column order
    heads = []
    for h in range(hq):
        scores = (q_heads[:, h] @ k[h // g].T) / d ** 0.5
        heads.append(scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v[h // g])  # [B, D]
    ref = torch.stack(heads, dim=1).reshape(b, hq * d) @ w.T

    q = q_heads.unflatten(1, (hk, g)).transpose(1, 2).contiguous()  # [B, G, Hkv, D]: the rope's output layout
    open_, shut = torch.zeros(()), torch.full((), torch.finfo(torch.float32).min)
    o = torch.nn.functional.scaled_dot_product_attention(_grouped_queries(q), k[None], v[None],
                                                         attn_mask=_grouped_mask(allowed, g, open_, shut))
    torch.testing.assert_close(_grouped_output(o, b) @ _grouped_o_weight(w, hk, d).T, ref, atol=1e-5, rtol=0)
    bmhk = torch.randn(1, b * g, hk, d, generator=gen).transpose(1, 2)  # [1, Hkv, B*G, D] in BMHK memory
    assert _grouped_output(bmhk, b).data_ptr() == bmhk.data_ptr() and _grouped_output(bmhk, b)._base is not None
    assert torch.equal(_grouped_o_weight(w, 1, d), w) and torch.equal(_grouped_o_weight(w, hq, d), w)  # G or Hkv 1


def _gqa_target(heads: int = 6, kv_heads: int = 2, layers: int = 3):
    """A tiny Llama with G = heads / kv_heads query heads per kv head and several kv heads (tiny_target has
    G = Hkv = 2): a grouped head order swapped (r, j) <-> (j, r) differs from HF's only when both exceed 1."""
    import transformers as tf

    torch.manual_seed(9)
    cfg = tf.LlamaConfig(vocab_size=96, hidden_size=48, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=256,
                         tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    return tf.LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("heads", [(6, 2), (4, 4), (4, 1)])  # GQA with G=3, Hkv=2; MHA; MQA
def test_gqa_head_order_tree_step_matches_hf(heads):
    """A multi-row tree step (bucketed: the graph path's buffers) of GQA / MHA / MQA models equals HF: the query
    rows, the mask rows, the grouped output and the permuted o_proj must agree on one head order."""
    model = _gqa_target(*heads)
    ref, fast = HFTarget(model, (1, 3)), FastTarget(model, (1, 3), max_len=64, buckets=(8,))
    gen = torch.Generator().manual_seed(4)
    prompt = torch.randint(3, 90, (9,), generator=gen)
    _close(ref.forward(prompt), fast.forward(prompt))  # eager (beyond the bucket)
    for b in (ref, fast):
        b.commit(torch.arange(9))
    parents = torch.tensor([-1, 0, 0, 1, 2, 2, 4])
    depths = torch.tensor([0, 1, 1, 2, 2, 2, 3])
    toks = torch.randint(3, 90, (7,), generator=gen)
    _close(ref.forward(toks, depths, ancestry(parents)), fast.forward(toks, depths, ancestry(parents)))
    for b in (ref, fast):
        b.commit(torch.tensor([0, 2, 4, 6]))
    toks = torch.randint(3, 90, (3,), generator=gen)
    _close(ref.forward(toks), fast.forward(toks))


def test_in_place_residuals_leave_the_captured_features_intact(without_onednn):
    """A feature layer's input h is kept (feats[i]): that layer's first residual must not accumulate into it in
    place, or the drafter would read the layer's output. Features and logits equal HF's; one out-of-place addmm per
    feature layer below the last, every other residual in place."""
    from _opcount import HostOps

    model = tiny_target("llama", seed=3)
    ids = (0, 2, model.config.num_hidden_layers)
    ref, fast = HFTarget(model, ids), FastTarget(model, ids, max_len=64, buckets=(4,))
    prompt = torch.randint(3, 90, (7,), generator=torch.Generator().manual_seed(5))
    _close(ref.forward(prompt), fast.forward(prompt))
    for backend in (ref, fast):
        backend.commit(torch.arange(7))
    toks = torch.tensor([11, 12, 13])
    _close(ref.forward(toks), fast.forward(toks))
    (run,) = fast._graphs.values()
    with HostOps() as c, torch.no_grad():
        fast.step(run.tokens, run.positions, run.visible, run.base, run.cols)
    layers = fast.num_layers
    assert c.kernels["aten.addmm.default"] == 2  # layers 0 and 2 (the last id is the final hidden state)
    assert c.kernels["aten.addmm_.default"] == 2 * layers - 2


def test_qwen3_q_and_k_norms_apply_per_head():
    """Qwen3's q_norm and k_norm run as one RMSNorm over all q and k heads with a per-head weight table: with
    distinct random weights (the tiny model's are all ones) a swapped or misaligned table differs from HF."""
    model = tiny_target("qwen3", seed=4)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for layer in model.model.layers:
            for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm):
                norm.weight.copy_(torch.rand(norm.weight.shape, generator=gen) * 2)
    ref, fast = HFTarget(model, (2,)), FastTarget(model, (2,), max_len=64, buckets=(4,))
    prompt = torch.randint(3, 90, (7,), generator=gen)
    _close(ref.forward(prompt), fast.forward(prompt))
    for b in (ref, fast):
        b.commit(torch.arange(7))
    toks = torch.randint(3, 90, (3,), generator=gen)
    _close(ref.forward(toks), fast.forward(toks))


def test_eager_prefill_keeps_cudnn_attention_off(monkeypatch):
    """cuDNN's attention builds a graph per new shape (a slow build per new prompt length): the target's eager
    steps (a prefill at its exact size) call SDPA with it disabled; the bucketed steps, captured once per shape on
    CUDA, keep torch's choice."""
    import torch.nn.functional as F

    seen: list[bool] = []
    real = F.scaled_dot_product_attention

    def spy(*a, **kw):
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return real(*a, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    model = tiny_target("llama", seed=2)
    target = FastTarget(model, max_len=64, buckets=(1, 4))
    target.forward(torch.tensor([5, 17, 33, 8, 9, 11]))  # 6 rows: past the buckets, eager
    layers = target.num_layers
    assert seen == [False] * layers
    target.commit(torch.arange(6))
    target.forward(torch.tensor([12]))  # a bucketed step
    assert seen[layers:] == [True] * layers and torch.backends.cuda.cudnn_sdp_enabled()
