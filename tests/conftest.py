"""Tiny random models built from configs: fp32, seeded, no network."""

from __future__ import annotations

import os

# Triton's interpreter for the kernel tests on CPU, for the whole session: triton reads it when it is first imported
# (its own jitted library functions are compiled or interpreted by it), so it is set before anything imports triton
os.environ["TRITON_INTERPRET"] = "1"

import pytest
import torch

from eaglespec.backends.hf import HFTarget
from eaglespec.checkpoint.config import DraftConfig, default_aux_layer_ids
from eaglespec.draft.eagle3 import Eagle3Drafter

VOCAB = 96


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """Tiny models: intra-op threads only add overhead (many times slower on a busy 2-core box)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True)
def _no_gc_freeze(monkeypatch):
    """gc.freeze (api.settle_heap: bench's timed loops, serve) does nothing in tests: a frozen heap would outlive
    the test that froze it."""
    import gc

    monkeypatch.setattr(gc, "freeze", lambda: None)


def tiny_target(arch: str = "llama", seed: int = 0, attn: str = "sdpa", vocab: int = VOCAB, layers: int = 4):
    """A tiny random HF causal LM of the named family (fp32, eval mode)."""
    import transformers as tf

    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    if arch == "llama":
        cfg, cls = tf.LlamaConfig(**common), tf.LlamaForCausalLM
    elif arch == "qwen2":
        cfg, cls = tf.Qwen2Config(**common), tf.Qwen2ForCausalLM
    elif arch == "qwen3":
        cfg, cls = tf.Qwen3Config(head_dim=8, **common), tf.Qwen3ForCausalLM
    elif arch == "mistral":
        cfg, cls = tf.MistralConfig(sliding_window=None, **common), tf.MistralForCausalLM
    else:
        raise ValueError(arch)
    cfg._attn_implementation = attn
    model = cls(cfg).eval()
    # sharpen the output so greedy paths are not decided by 1e-7 ties
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)
    return model


def tiny_draft_config(target, **overrides) -> DraftConfig:
    c = target.config
    layers = c.num_hidden_layers
    fields = dict(method="eagle3", hidden_size=c.hidden_size, intermediate_size=64, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=c.hidden_size // 4, vocab_size=c.vocab_size,
                  draft_vocab_size=c.vocab_size, target_hidden_size=c.hidden_size,
                  aux_layer_ids=(2, layers // 2, max(layers - 1, 0)) if layers < 5 else default_aux_layer_ids(layers))
    fields.update(overrides)
    return DraftConfig(**fields)


def tiny_drafter(target, seed: int = 1, **overrides) -> Eagle3Drafter:
    torch.manual_seed(seed)
    d = Eagle3Drafter(tiny_draft_config(target, **overrides)).eval()
    d.set_target_embedding(target.get_input_embeddings())
    return d


@pytest.fixture(params=["llama", "qwen2", "qwen3"])
def arch(request):
    return request.param


@pytest.fixture
def hf_target(arch):
    return HFTarget(tiny_target(arch))


def reference_greedy(model, prompt: list[int], max_new_tokens: int, eos: int | None = None) -> list[int]:
    """HF generate(do_sample=False): the ground truth for greedy exactness."""
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                         eos_token_id=eos, pad_token_id=0, min_new_tokens=0)
    return out[0, len(prompt):].tolist()


# -- a byte-level tokenizer with a chat template (no network), for API / CLI / server tests ------
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def byte_tokenizer():
    """259 ids: <pad>=0, <|im_start|>=1, <|im_end|>=2 (eos), then the 256 byte-level tokens.

    Every non-ASCII character is split across 2-4 tokens, so detokenizing must wait for whole
    UTF-8 sequences.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=lambda ch: _BYTE_OF[ch])
    vocab = {"<pad>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    vocab.update({ch: 3 + i for i, ch in enumerate(alphabet)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<|im_start|>",
                                   eos_token="<|im_end|>", additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _bytes_to_unicode() -> dict[str, int]:
    """GPT-2's byte -> printable character map, inverted (char -> byte)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


_BYTE_OF = _bytes_to_unicode()
BYTE_VOCAB = 259


def cycle_target(tokenizer, text: str = "aé中😀 "):
    """A tiny Llama whose greedy next token depends only on the last token: it cycles through the
    byte tokens of `text` (all bytes distinct), so its output splits multi-byte characters."""
    import transformers as tf

    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(set(ids)) == len(ids), "cycle text bytes must be distinct"
    v = BYTE_VOCAB
    cfg = tf.LlamaConfig(vocab_size=v, hidden_size=264, intermediate_size=16, num_hidden_layers=2,
                         num_attention_heads=1, num_key_value_heads=1, max_position_embeddings=512,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in model.model.layers:  # every layer becomes the identity on the residual stream
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.copy_(torch.eye(v, 264))  # one-hot embeddings
        nxt = torch.full((v,), ids[0])
        nxt[torch.tensor(ids)] = torch.tensor(ids[1:] + ids[:1])
        head = torch.zeros(v, 264)
        head[nxt, torch.arange(v)] = 1.0  # logits[x] peaks at nxt[x]
        model.lm_head.weight.copy_(head)
    return model


@pytest.fixture
def without_onednn(monkeypatch):
    """F.linear on CPU too (eaglespec.kernels.onednn off): the op-count tests count the CUDA path's GEMMs (addmm / addmm_)."""
    import eaglespec.kernels.onednn

    monkeypatch.setattr(eaglespec.kernels.onednn, "available", lambda: False)

