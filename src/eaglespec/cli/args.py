"""Flags shared by the subcommands, their validation, and the CLI's output conventions.

Every subcommand module imports this one and library modules; none imports cli.main or another subcommand.
Validation here runs before any model loads, so bad input costs a one-line error, not a model load.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

from eaglespec.config import BACKENDS, EngineConfig
from eaglespec.errors import EagleSpecError


def log(msg: str) -> None:
    """One line on stderr (stdout holds only a command's result)."""
    print(msg, file=sys.stderr, flush=True)


def quiet_libraries(verbose: bool) -> None:
    """Without -v: no progress bars and no info logs from transformers and huggingface_hub (warnings and errors
    still print)."""
    import transformers

    if verbose:
        transformers.utils.logging.set_verbosity_info()
        transformers.utils.logging.enable_progress_bar()
        return
    transformers.utils.logging.set_verbosity_warning()
    transformers.utils.logging.disable_progress_bar()
    try:
        from huggingface_hub.utils import disable_progress_bars
    except ImportError:  # pragma: no cover - transformers depends on huggingface_hub
        return
    disable_progress_bars()


# -- flags ----------------------------------------------------------------------------------------
def add_model_args(p: argparse.ArgumentParser) -> None:
    """--target/--draft/--aux-rule/--strict and the engine's flags (the fields of eaglespec.config.EngineConfig)."""
    p.add_argument("--target", default=None,
                   help="target model: a local HF directory or hub id (default: SmolLM2-135M-Instruct)")
    p.add_argument("--draft", default=None,
                   help="draft checkpoint directory (default: the shipped drafter for the default target)")
    p.add_argument("--aux-rule", default="auto", choices=["auto", "output", "entering"],
                   help="how to read the checkpoint's aux layer ids: auto (+1 when the first id is 1, as SGLang), "
                        "output (output-of-layer ids, +1), entering (as written); default auto")
    p.add_argument("--strict", action="store_true",
                   help="refuse a drafter whose manifest names a different target (default: warn)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda when available, else cpu)")
    p.add_argument("--dtype", default=None,
                   help="float32 | bfloat16 | float16: weights and activations (default: bfloat16 on a GPU, "
                        "float32 on CPU)")
    p.add_argument("--backend", default=None, choices=BACKENDS,
                   help="target backend: fast (static KV cache; CUDA graphs on a GPU, oneDNN projections on CPU), "
                        "hf (the model's own forward), auto (fast where the architecture is supported, else hf); "
                        "default auto")
    p.add_argument("--kernels", action=argparse.BooleanOptionalAction, default=None,
                   help="Triton kernels on the fast backend (default: on CUDA where triton is installed)")
    p.add_argument("--draft-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="draft with a static drafter KV cache and CUDA graphs (default: on with the fast backend "
                        "on CUDA)")
    p.add_argument("--round-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="run each round (draft, verify, acceptance, KV commit) as one CUDA graph with one host sync; "
                        "needs the fast backend and draft graphs (default: on CUDA)")
    p.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=None,
                   help="queue the next round on the GPU before the host reads this one's tokens (default: on with "
                        "the fast backend on CUDA)")
    p.add_argument("--chunked-prefill", action=argparse.BooleanOptionalAction, default=None,
                   help="prefill prompts longer than the largest captured shape in chunks of it (default: on CUDA)")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="CPU threads for torch on a CPU device (default: the cores not busy with other processes)")
    p.add_argument("--adaptive", action=argparse.BooleanOptionalAction, default=None,
                   help="per round, draft or take a plain target step, whichever has cost less time per token "
                        "lately (lossless either way): for drafters that accept too little to pay, e.g. at high "
                        "temperatures; the batched engine instead times its rounds per batch size when it starts "
                        "and takes the chain length (or plain steps) with the most expected tokens/s (default: on "
                        "in the batched engine, --max-batch > 1; off for one sequence)")


def add_tree_args(p: argparse.ArgumentParser, policy: bool = True) -> None:
    """Tree flags. A flag left out takes the drafter's recommended shape (tree_defaults in its
    eaglespec_manifest.json), else the generic default in the help. policy=False leaves out --tree."""
    if policy:
        p.add_argument("--tree", default=None, choices=["chain", "static", "dynamic", "auto"],
                       help="draft tree policy; auto: the shape with the most predicted tokens/s for the drafter's "
                            "measured acceptance (its manifest's acceptance_profile) and this device's measured "
                            "costs (default: auto on a GPU when the drafter's manifest has an acceptance profile and no "
                            "tree_defaults.cuda; else "
                            "its recommendation where its manifest has one: tree_defaults.cuda on a GPU, "
                            "tree_defaults.sampled with a temperature; else chain)")
    p.add_argument("--k", type=int, default=None,
                   help="chain length (default: the drafter's recommendation, else 5; 0 = plain decoding)")
    p.add_argument("--top-k", type=int, default=None,
                   help="tree expansion width per node (default: the drafter's recommendation, else 10)")
    p.add_argument("--depth", type=int, default=None,
                   help="max tree depth (default: the drafter's recommendation, else 8)")
    p.add_argument("--budget", type=int, default=None,
                   help="draft tokens verified per round (default: the drafter's recommendation, else 60; "
                        "0 = plain decoding)")


def add_batch_args(p: argparse.ArgumentParser, default: str) -> None:
    """The batched engine's flags (EngineConfig.max_batch, prefill_chunk, max_batch_tokens, kv_memory,
    speculate_up_to)."""
    p.add_argument("--max-batch", type=int, default=None, metavar="N",
                   help=f"sequences advanced together by the batched engine (default: {default})")
    p.add_argument("--prefill-chunk", type=int, default=None, metavar="N",
                   help="prompt tokens a joining sequence prefills per step while others decode (default 512)")
    p.add_argument("--max-batch-tokens", type=int, default=None, metavar="N",
                   help="a request joins only while the live requests' prompts + max tokens, with its own, stay "
                        "within N (a bound on the KV memory; default: no bound beyond --max-batch)")
    p.add_argument("--kv-memory", type=float, default=None, metavar="F",
                   help="the share (0-1] of the GPU memory free when the engine starts that the batch's KV may take: "
                        "a request joins only while it fits, and one that never can is refused (default 0.9 on a "
                        "GPU; on a CPU no bound)")
    p.add_argument("--speculate-up-to", type=int, default=None, metavar="N",
                   help="draft while at most N sequences are live, plain batched steps above (default: always)")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    """Sampling flags. --top-k is the tree width (the CLI contract), so sampling top-k is --sample-top-k."""
    p.add_argument("--temperature", type=float, default=None,
                   help="sampling temperature (0 = greedy; default: the target's generation_config)")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass (default: generation_config)")
    p.add_argument("--sample-top-k", type=int, default=None,
                   help="sample from the k most likely tokens (0 = off; default: generation_config)")
    p.add_argument("--min-p", type=float, default=None, help="min-p filter (default: generation_config)")
    p.add_argument("--seed", type=int, default=None, help="random seed: the same seed gives the same output")
    add_draft_temperature(p)


def add_draft_temperature(p: argparse.ArgumentParser) -> None:
    """--draft-temperature: the drafter's own temperature under sampling. 0 drafts the top-k children, verified
    with the point-mass scheme (q = 1)."""
    p.add_argument("--draft-temperature", type=float, default=None, metavar="T",
                   help="with a sampling temperature: the drafter's temperature (default: the target's; 0 = top-k "
                        "children, verified with the point-mass scheme; lossless either way)")


def sampling_options(args: argparse.Namespace, generation_config) -> dict:
    """Flags over the target's generation_config -> EagleSpec.generate keyword options ({} = greedy)."""
    from eaglespec.sampling import from_generation_config

    cfg = from_generation_config(generation_config, args.temperature, args.sample_top_k, args.top_p, args.min_p,
                                 args.seed)
    if cfg is None:
        return {}
    t = cfg.target
    opts = {"temperature": t.temperature, "top_k": t.top_k, "top_p": t.top_p, "min_p": t.min_p, "seed": cfg.seed}
    if getattr(args, "draft_temperature", None) is not None:
        opts["draft_temperature"] = args.draft_temperature
    return opts


# -- validation (before anything loads) -----------------------------------------------------------
def non_negative(args: argparse.Namespace, *names: str) -> None:
    """Refuse a negative value of any of these flags (absent or None flags pass)."""
    for name in names:
        value = getattr(args, name, None)
        if value is not None and value < 0:
            raise EagleSpecError(f"--{name.replace('_', '-')} must be >= 0, got {value}")


def positive(args: argparse.Namespace, *names: str) -> None:
    """Refuse a zero or negative value of any of these flags (absent or None flags pass)."""
    for name in names:
        value = getattr(args, name, None)
        if value is not None and value <= 0:
            raise EagleSpecError(f"--{name.replace('_', '-')} must be > 0, got {value}")


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """The EngineConfig the engine flags name (EngineConfig.from_args); a bad value is a one-line error."""
    return EngineConfig.from_args(args)


def check_target(target: str | None) -> None:
    """A --target that names a local path must exist (a hub id is checked when it loads)."""
    if target is None or Path(target).exists():
        return
    if target.startswith((".", "/", "~")) or target.count("/") > 1:  # a hub id is "name" or "org/name"
        raise EagleSpecError(f"--target {target}: no such directory")


def check_model_inputs(args: argparse.Namespace) -> EngineConfig:
    """Validate the model and engine flags without loading anything; returns the EngineConfig they name."""
    from eaglespec.backends.loading import resolve_device, resolve_dtype
    from eaglespec.checkpoint.drafter import check_draft_dir

    config = engine_config(args)
    check_target(getattr(args, "target", None))
    check_draft_dir(getattr(args, "draft", None))
    resolve_dtype(config.dtype, resolve_device(config.device))  # e.g. --device cuda without CUDA, --dtype int8
    non_negative(args, "k", "top_k", "depth", "budget")
    return config


def set_threads(config: EngineConfig, verbose: bool = False) -> None:
    """On a CPU device, torch's threads: --threads, else the cores not busy now (eaglespec.cpu.apply_threads)."""
    from eaglespec.cpu import apply_threads

    n = apply_threads(config.threads, config.device)
    if n is not None and verbose:
        log(f"eaglespec: {n} CPU thread{'s' if n != 1 else ''}")


def load_eaglespec(args: argparse.Namespace, config: EngineConfig):
    """Set the CPU threads, then load the target and drafter the flags name (the drafter in use said with -v)."""
    from eaglespec.api import EagleSpec

    set_threads(config, args.verbose)
    es = EagleSpec.from_args(args, config=config)
    if args.verbose:
        log(f"eaglespec: {es.draft_note}")
    return es


def check_module(module: str, extra: str, what: str) -> None:
    """Refuse, with the install command for `extra`, when `module` is not installed."""
    if importlib.util.find_spec(module) is None:
        raise EagleSpecError(f"{what} needs the {extra} extra: {install_hint(extra)}")


def install_hint(extra: str) -> str:
    """The command that installs eaglespec's `extra` the way eaglespec itself was installed: from a checkout
    (editable or not) the command to run in it, else from the package index."""
    try:
        dist = importlib.metadata.distribution("eaglespec")
        direct = dist.read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        direct = None
    if direct:
        info = json.loads(direct)
        url = urlparse(info.get("url", ""))
        if url.scheme == "file":
            where = unquote(url.path)
            editable = bool(info.get("dir_info", {}).get("editable"))
            return f"pip install {'-e ' if editable else ''}\".[{extra}]\" (run in {where})"
    return f"pip install \"eaglespec[{extra}]\""
