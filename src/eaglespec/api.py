"""The Python API: load a target + drafter pair once, then generate or stream.

    from eaglespec import EagleSpec
    es = EagleSpec.from_pretrained()                  # default SmolLM2 target + shipped drafter
    out = es.generate("Write a haiku about the sea.", max_new_tokens=64)
    print(out.text, out.stats)
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from eaglespec.backends.loading import DEFAULT_TARGET, eos_ids, load_target
from eaglespec.checkpoint.drafter import check_draft_dir, load_drafter, random_drafter
from eaglespec.checkpoint.manifest import check_manifest
from eaglespec.config import EngineConfig
from eaglespec.engine.batch import BatchEngine, BatchRequest
from eaglespec.engine.build import build_batch_engine, build_engine, build_target
from eaglespec.engine.loop import GenerationResult
from eaglespec.errors import EagleSpecError
from eaglespec.tree.auto import CostModel, auto_line, auto_trees, drafter_profile, wants_auto
from eaglespec.tree.core import TreeSpec, static_layout

REPO_MODELS = Path(__file__).resolve().parents[2] / "models"
DEFAULT_DRAFT = REPO_MODELS / "smollm2-135m-instruct-eagle3"


@dataclass
class Output:
    text: str
    token_ids: list[int]
    prompt_token_ids: list[int]
    stats: dict[str, Any]
    result: GenerationResult
    finish_reason: str = "length"  # "stop": EOS or a stop string; "length": max_new_tokens


GENERIC_TREES: dict[str, dict[str, int]] = {"chain": {"k": 5}, "dynamic": {"depth": 8, "top_k": 10, "budget": 60},
                                             "static": {"depth": 8, "top_k": 10, "budget": 60}}


def load_drafter_for(model, tokenizer, draft: str, aux_rule: str = "auto", strict: bool = False
                     ) -> tuple[torch.nn.Module, str]:
    """The drafter in `draft` (a directory) for `model`: checked against it (its manifest too; `strict` refuses one
    made for another target), on the model's device and dtype. Returns (drafter, a one-line description)."""
    c = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    drafter = load_drafter(draft, target_num_layers=c.num_hidden_layers, target_hidden_size=c.hidden_size,
                           target_vocab_size=model.get_output_embeddings().weight.shape[0], aux_rule=aux_rule)
    note = f"drafter {draft} ({drafter.cfg.method}, aux ids {list(drafter.cfg.aux_layer_ids)}: {drafter.cfg.aux_rule})"
    if drafter.manifest is not None:
        check_manifest(drafter.manifest, model, tokenizer, strict=strict, where=f"drafter {draft}")
    return drafter.to(device=model.device, dtype=model.dtype), note


def tree_defaults(drafter, where: str = "drafter", device: torch.device | str | None = None,
                  sampled: bool = False, greedy: bool = False) -> dict[str, dict[str, Any]]:
    """The tree shapes a drafter's manifest recommends (`tree_defaults`, e.g. {"dynamic": {"depth": 5, "top_k": 6,
    "budget": 24}}: measured with bench/tree_sweep.py for that drafter), {} when it has none. `static` may also
    carry `choices` (rank paths [[0], [1], [0, 0], ...], best first: bench/fit_static_tree.py --write), returned
    as a tuple of tuples. Overrides, knob by knob, in this order: with `greedy` (requests at temperature 0),
    `tree_defaults.greedy` (shapes in the same form: a wider tree pays where every row is an argmax check); with
    `sampled` (requests with a temperature), the shapes the sampled policy holds (e.g. {"chain": {"k": 3}}, or
    {"kind": "static", "chain": {"k": 3}}; on a CPU `device`, `tree_defaults.cpu.sampled`'s when there is one,
    else `tree_defaults.sampled`'s); then on a CPU `device`, `tree_defaults.cpu` (shapes in the same form)."""
    found = (getattr(drafter, "manifest", None) or {}).get("tree_defaults") or {}
    if not isinstance(found, dict):
        raise EagleSpecError(f"{where}: eaglespec_manifest.json field tree_defaults must be an object")
    out = _shapes(found, where, "tree_defaults")
    on_cpu = device is not None and torch.device(device).type == "cpu"
    policy_key, policy = _sampled_policy(found, on_cpu)
    for key, value, applies in (("greedy", found.get("greedy"), greedy and found.get("greedy") is not None),
                                (policy_key, policy, sampled and isinstance(policy, dict)),
                                ("cpu", found.get("cpu"), on_cpu and found.get("cpu") is not None)):
        if not applies:
            continue
        if not isinstance(value, dict):
            raise EagleSpecError(f"{where}: eaglespec_manifest.json field tree_defaults.{key} must be an object")
        for kind, knobs in _shapes(value, where, f"tree_defaults.{key}").items():
            out[kind] = {**out.get(kind, {}), **knobs}
    return out


def _sampled_policy(found: dict, on_cpu: bool) -> tuple[str, Any]:
    """(field name, value) of the sampled policy that applies: `tree_defaults.cpu.sampled` on a CPU device when the
    manifest has one (sampled trees are measured per device), else `tree_defaults.sampled` (None when absent)."""
    cpu = found.get("cpu")
    if on_cpu and isinstance(cpu, dict) and cpu.get("sampled") is not None:
        return "cpu.sampled", cpu["sampled"]
    return "sampled", found.get("sampled")


def _shapes(found: dict, where: str, field: str) -> dict[str, dict[str, Any]]:
    """The tree kinds of a manifest object (chain / static / dynamic -> knobs), validated; other keys skipped."""
    out: dict[str, dict[str, Any]] = {}
    for kind, knobs in found.items():
        if kind not in GENERIC_TREES:
            continue  # e.g. "measured": provenance text; "cuda" / "sampled": policies; "greedy" / "cpu": overrides
        if not isinstance(knobs, dict):
            raise EagleSpecError(f"{where}: eaglespec_manifest.json field {field}.{kind} must be an object")
        knobs = dict(knobs)
        if kind == "static" and "choices" in knobs:
            knobs["choices"] = _manifest_choices(knobs["choices"], where, f"{field}.static.choices")
        for key, value in knobs.items():
            if key == "choices" and kind == "static":
                continue
            if key not in GENERIC_TREES[kind] or not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise EagleSpecError(f"{where}: eaglespec_manifest.json field {field}.{kind}.{key} must be "
                                     f"one of {', '.join(GENERIC_TREES[kind])} with a non-negative integer value")
        out[kind] = knobs
    return out


def _manifest_choices(value: Any, where: str, name: str = "tree_defaults.static.choices"
                      ) -> tuple[tuple[int, ...], ...]:
    """A static tree's `choices` (tree_defaults.static.choices, or a policy's, e.g. tree_defaults.sampled.static.
    choices: `name`) -> paths, validated as a static tree (a one-line error naming the field)."""
    field = f"{where}: eaglespec_manifest.json field {name}"
    if not isinstance(value, list) or not value or not all(isinstance(p, list) for p in value):
        raise EagleSpecError(f"{field} must be a non-empty list of rank paths like [[0], [1], [0, 0]]")
    try:
        static_layout(value)
    except EagleSpecError as exc:
        raise EagleSpecError(f"{field} is not a static tree: {exc}") from None
    return tuple(tuple(p) for p in value)


def recommended_tree(drafter, key: str, where: str = "drafter", device: torch.device | str | None = None
                     ) -> str | None:
    """The tree policy a drafter's manifest recommends when the user names none: `tree_defaults.cuda` (greedy
    requests on a CUDA device, e.g. "static") or the sampled policy (requests with a temperature: on a CPU `device`
    `tree_defaults.cpu.sampled` when there is one, else `tree_defaults.sampled`; a kind, one kind with its shape:
    {"chain": {"k": 3}}, or a kind named by "kind" beside the shapes sampled requests take: {"kind": "static",
    "chain": {"k": 3}}), else None."""
    found = (getattr(drafter, "manifest", None) or {}).get("tree_defaults") or {}
    on_cpu = device is not None and torch.device(device).type == "cpu"
    field, found = _sampled_policy(found, on_cpu) if key == "sampled" else (key, found.get(key))
    if key == "sampled" and isinstance(found, dict):  # its shapes: tree_defaults(..., sampled=True)
        found = found.get("kind", next(iter(found)) if len(found) == 1 else found)
    if found is not None and (not isinstance(found, str) or found not in GENERIC_TREES):
        raise EagleSpecError(f"{where}: eaglespec_manifest.json field tree_defaults.{field} must be one of "
                             f"{', '.join(GENERIC_TREES)}" + (" (or one of them with its shape, e.g. "
                             '{"chain": {"k": 3}}, or {"kind": "static", "chain": {"k": 3}})' if key == "sampled"
                             else "") + f", got {found!r}")
    return found


def tree_spec(tree: str | None = "chain", k: int | None = None, top_k: int | None = None, depth: int | None = None,
              budget: int | None = None, defaults: dict[str, dict[str, Any]] | None = None) -> TreeSpec:
    """CLI/API knobs -> TreeSpec. A knob left None takes the drafter's recommendation (`defaults`, from
    tree_defaults) and then the generic default: chain k=5; dynamic/static budget 60, depth 8, top-k 10.
    tree None: a chain. A static tree uses the recommended `choices` (a fitted tree) when there are any, else
    EAGLE-1's 25-node tree; --depth/--budget cut it (TreeSpec.static_choices: the best `budget` nodes of a fitted
    tree). A budget (given or recommended) above the tree's size is named in one line on stderr."""
    tree = tree or "chain"
    if tree == "auto":
        raise EagleSpecError("--tree auto is chosen from measured costs: resolve_trees(..., costs=...) or "
                             "EagleSpec.from_pretrained resolves it")
    if tree not in GENERIC_TREES:
        raise EagleSpecError(f"--tree {tree!r} is not one of chain, static, dynamic, auto")
    recommended = dict((defaults or {}).get(tree) or {})
    choices = recommended.pop("choices", None) if tree == "static" else None
    base = {**GENERIC_TREES[tree], **recommended}
    if tree == "chain":
        return TreeSpec("chain", depth=base["k"] if k is None else k)
    spec = TreeSpec(tree, depth=base["depth"] if depth is None else depth,
                    top_k=base["top_k"] if top_k is None else top_k,
                    budget=base["budget"] if budget is None else budget, choices=choices)
    note = spec.static_shortfall()
    # named when the budget was given, or recommended for the default tree; the generic budget (60) and a fitted
    # tree's own budget (its size, cut by --depth) mean "the whole tree"
    if note and (budget is not None or ("budget" in recommended and choices is None)):
        log(f"eaglespec: {note}")
    return spec


def resolve_trees(knobs: dict, drafter, where: str = "drafter", device: torch.device | str = "cpu",
                  costs: Callable[[], CostModel] | None = None) -> tuple[TreeSpec, TreeSpec | None]:
    """tree_spec's knobs -> (the tree of greedy requests, the tree of sampled ones or None = the same). Greedy
    requests take tree_defaults.greedy's shapes, requests with a temperature the shapes the sampled policy holds
    (tree_defaults(..., sampled=True)). When the knobs name no tree: the drafter's tree_defaults.cuda policy on a
    CUDA device (else a chain), and its sampled policy's kind for requests with a temperature (tree_defaults.sampled;
    on a CPU device tree_defaults.cpu.sampled, when there is one); a named tree is that kind at every temperature.
    On a CPU device, the shapes with tree_defaults.cpu's overrides.

    Tree "auto" (and, given `costs`, no tree knob on a CUDA device with a drafter whose manifest has an
    acceptance_profile: tree.auto.wants_auto): the trees tree.auto chooses from that profile and the CostModel
    `costs()` returns (measured on this device), named with their predicted tokens/s in one line on stderr."""
    if knobs.get("tree") == "auto" or (costs is not None and wants_auto(knobs, drafter, device)):
        profile = drafter_profile(drafter, where)
        if costs is None:
            raise EagleSpecError("--tree auto needs the round costs of this target on this device "
                                 "(EagleSpec.from_pretrained measures them)")
        measured = costs()
        greedy, sampled = auto_trees(knobs, profile, measured)
        log(auto_line(greedy, sampled, measured))
        spec = greedy.spec()
        return spec, None if sampled is None or sampled.spec() == spec else sampled.spec()
    greedy_shapes = tree_defaults(drafter, where, device, greedy=True)
    named = knobs.get("tree")
    kind = named or (recommended_tree(drafter, "cuda", where) if torch.device(device).type == "cuda" else None)
    spec = tree_spec(**{**knobs, "tree": kind}, defaults=greedy_shapes)
    policy = None if named else recommended_tree(drafter, "sampled", where, device)
    sampled = tree_spec(**{**knobs, "tree": policy or kind}, defaults=tree_defaults(drafter, where, device, sampled=True))
    return spec, (None if sampled == spec else sampled)


def tree_label(spec: TreeSpec) -> str:
    """'chain k=4', 'dynamic depth 5 top-k 6 budget 24': the shape a run used, for logs and reports."""
    if spec.kind == "chain":
        return f"chain k={spec.depth}"
    return f"{spec.kind} depth {spec.depth} top-k {spec.top_k} budget {spec.budget}"


class EagleSpec:
    """A loaded target + drafter pair and the engine that runs them."""

    def __init__(self, model, tokenizer, drafter, spec: TreeSpec | None = None, draft_note: str = "",
                 config: EngineConfig | None = None, sampled_spec: TreeSpec | None = None):
        self.model, self.tokenizer, self.drafter = model, tokenizer, drafter
        self.config = config = config or EngineConfig()
        self.spec = spec or TreeSpec()
        self.sampled_spec = sampled_spec  # the tree for requests with a temperature (None: self.spec)
        self.draft_note = draft_note
        ids = tuple(drafter.feature_layer_ids) if drafter is not None else ()
        self.target = build_target(model, config, ids)
        self.engine = build_engine(self.target, drafter, self.spec, config, draft_max_len=self.draft_max_len)
        self._owner: Stream | None = None  # the generation using the engine (one sequence at a time)
        self._batch: BatchEngine | None = None  # the batched engine, built on first use

    @classmethod
    def from_pretrained(cls, target: str | None = None, draft: str | None = None, config: EngineConfig | None = None,
                        spec: TreeSpec | None = None, tree: dict[str, Any] | None = None, aux_rule: str = "auto",
                        strict: bool = False, **engine) -> EagleSpec:
        """Load target + drafter and build the engine.

        config: how the engine runs (EngineConfig); keyword arguments named after its fields (device="cpu",
        dtype="float32", backend="hf", ...) override it. `strict` refuses a drafter whose manifest names another
        target. `tree`: tree_spec's knobs ({"tree": "dynamic", "depth": None, ...}), resolved against the
        drafter's recommended shapes (tree_defaults) when `spec` is None; with no tree named and a manifest that
        recommends one for sampling (tree_defaults.sampled), requests with a temperature draft that tree. Tree
        "auto", the default on a GPU for a drafter whose manifest has an acceptance_profile and no
        tree_defaults.cuda (tree.auto.wants_auto): choose_trees."""
        config = (config or EngineConfig()).replace(**engine)
        check_draft_dir(draft, "draft")
        model, tok = load_target(target, device=config.device, dtype=config.dtype)
        if draft is None and target in (None, DEFAULT_TARGET) and DEFAULT_DRAFT.is_dir():
            draft = str(DEFAULT_DRAFT)
        if draft is None:
            drafter = random_drafter(model).to(device=model.device, dtype=model.dtype)
            note = "no trained drafter given: using a RANDOMLY INITIALISED drafter (expect tau ~ 1)"
        else:
            drafter, note = load_drafter_for(model, tok, draft, aux_rule, strict)
        sampled_spec = None
        auto = spec is None and wants_auto(tree or {}, drafter, model.device)
        if spec is None and not auto:
            spec, sampled_spec = resolve_trees(tree or {}, drafter, f"drafter {draft}", model.device)
        es = cls(model, tok, drafter, spec, note, config, sampled_spec)
        if auto:
            es.choose_trees(tree or {}, f"drafter {draft}")
        return es

    def choose_trees(self, knobs: dict[str, Any], where: str = "drafter") -> None:
        """--tree auto: draft the trees tree.auto chooses from the drafter's acceptance profile and this target's
        and drafter's round costs on this device (measured once, then cached: engine.calibrate.cached_costs); the
        engine is rebuilt for them."""
        from eaglespec.engine.calibrate import cached_costs

        self.spec, self.sampled_spec = resolve_trees(
            {**knobs, "tree": "auto"}, self.drafter, where, self.model.device,
            costs=lambda: cached_costs(self.engine, self.model, self.drafter))
        self.engine = build_engine(self.target, self.drafter, self.spec, self.config,
                                   draft_max_len=self.draft_max_len)

    @classmethod
    def from_args(cls, args, spec: TreeSpec | None = None, **overrides) -> EagleSpec:
        """from_pretrained with the CLI's model and engine flags (EngineConfig.from_args) and, when `spec` is None,
        the tree flags (--tree/--k/--top-k/--depth/--budget) where the command has them."""
        knobs = {name: getattr(args, name) for name in ("tree", "k", "top_k", "depth", "budget") if hasattr(args, name)}
        kw = dict(target=args.target, draft=args.draft, config=EngineConfig.from_args(args), spec=spec, tree=knobs,
                  aux_rule=getattr(args, "aux_rule", "auto"), strict=getattr(args, "strict", False))
        kw.update(overrides)
        return cls.from_pretrained(**kw)

    # -- prompts ----------------------------------------------------------------------------------
    def encode(self, prompt: str | Sequence[dict] | Sequence[int], raw: bool = False) -> list[int]:
        """Token ids for a string (chat template unless raw), chat messages, or ids as given."""
        if isinstance(prompt, str):
            if raw or not getattr(self.tokenizer, "chat_template", None):
                return self.tokenizer.encode(prompt)
            prompt = [{"role": "user", "content": prompt}]
        if prompt and isinstance(prompt[0], dict):
            enc = self.tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True)
            return list(enc["input_ids"] if hasattr(enc, "keys") else enc)
        return [int(t) for t in prompt]

    def eos_ids(self) -> list[int]:
        return eos_ids(self.model, self.tokenizer)

    # -- generation -------------------------------------------------------------------------------
    @property
    def draft_max_len(self) -> int:
        """Rows of the drafter's static KV: the context length up to 8192, and room for a tree."""
        return min(self.context_length, 8192) + 512

    @property
    def context_length(self) -> int:
        """The target's maximum sequence length (prompt + new tokens)."""
        c = self.model.config.get_text_config() if hasattr(self.model.config, "get_text_config") else self.model.config
        return int(getattr(c, "max_position_embeddings", None) or 2048)

    def check_length(self, n_prompt: int, max_new_tokens: int) -> None:
        if max_new_tokens < 0:
            raise EagleSpecError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        if n_prompt + max_new_tokens > self.context_length:
            raise EagleSpecError(f"the prompt ({n_prompt} tokens) + max_new_tokens ({max_new_tokens}) exceed the "
                                 f"model's context length ({self.context_length} tokens)")

    def _engine_stream(self, ids: list[int], max_new_tokens: int, result: GenerationResult,
                       sampling: dict[str, Any]) -> Iterator[list[int]]:
        """The engine's per-round token lists. Sampling options (temperature, top_p, top_k, seed, ...)
        pass straight through to the engine; all None / temperature 0 means greedy."""
        cfg = sampling_config(sampling)
        if cfg is None:
            return self.engine.stream(ids, max_new_tokens, self.eos_ids(), result)
        return self._sampled_stream(ids, max_new_tokens, result, cfg)

    def _sampled_stream(self, ids: list[int], max_new_tokens: int, result: GenerationResult,
                        cfg) -> Iterator[list[int]]:
        """engine.stream with sampling, drafting the sampled tree (sampled_spec) when there is one."""
        spec = self.sampled_spec if self.engine.proposer is not None else None
        return self.engine.stream(ids, max_new_tokens, self.eos_ids(), result, sampling=cfg, spec=spec)

    def tree_for(self, temperature: float | None) -> TreeSpec:
        """The tree a request with this temperature drafts with."""
        return self.sampled_spec if temperature and self.sampled_spec is not None else self.spec

    def stream(self, prompt, max_new_tokens: int = 128, raw: bool = False, stop: str | Sequence[str] | None = None,
               **sampling) -> Stream:
        """Iterate to get text pieces as rounds are accepted (multi-byte characters are never split).

        The returned Stream also carries .text, .token_ids, .finish_reason ("stop" | "length") and
        .result (the GenerationResult with per-round stats) once iterated.
        """
        ids = self.encode(prompt, raw)
        self.check_length(len(ids), max_new_tokens)
        return Stream(self, ids, max_new_tokens, stop, sampling)

    def generate(self, prompt, max_new_tokens: int = 128, raw: bool = False, stop: str | Sequence[str] | None = None,
                 **sampling) -> Output:
        """Generate for a string (chat template unless raw), chat messages, or token ids."""
        st = self.stream(prompt, max_new_tokens, raw, stop, **sampling)
        for _ in st:
            pass
        return st.output()


    # -- batched generation ---------------------------------------------------------------------
    @property
    def batch_engine(self) -> BatchEngine:
        """The batched engine (engine/batch.py) over the same model and drafter, built on first use."""
        if self._batch is None:
            self._batch = build_batch_engine(self.model, self.drafter, self.spec, self.config,
                                             draft_max_len=self.draft_max_len)
        return self._batch

    def request(self, prompt, max_new_tokens: int = 128, raw: bool = False, stop: str | Sequence[str] | None = None,
                **sampling) -> BatchText:
        """One prompt as a request for the batched engine (not yet submitted), with its text stream."""
        ids = self.encode(prompt, raw)
        self.check_length(len(ids), max_new_tokens)
        cfg = sampling_config(sampling)
        spec = self.tree_for(cfg.target.temperature if cfg is not None else None)
        req = BatchRequest(ids, max_new_tokens, self.eos_ids(), cfg, spec)
        return BatchText(req, TextStream(self.tokenizer, stop))

    def generate_batch(self, prompts: Sequence, max_new_tokens: int = 128, raw: bool = False,
                       stop: str | Sequence[str] | None = None, **sampling) -> list[Output]:
        """Generate for many prompts at once (config.max_batch sequences advance together; the rest queue).
        Outputs in the order of `prompts`; greedy ones are the target's own greedy text (token for token in fp32),
        sampled ones draw from the request's own seed whatever its batch companions."""
        texts = [self.request(p, max_new_tokens, raw, stop, **sampling) for p in prompts]
        engine = self.batch_engine
        by_request = {id(t.request): t for t in texts}
        for t in texts:
            engine.submit(t.request)
        while not all(t.request.done for t in texts):
            for req, tokens in engine.step():
                t = by_request[id(req)]
                t.push(tokens)
                if t.detok.stopped:
                    engine.cancel(req)
        return [t.output() for t in texts]


class BatchText:
    """A batched request and its text: push() each step's tokens, output() once the request is done."""

    def __init__(self, request: BatchRequest, detok: TextStream):
        self.request, self.detok = request, detok

    def push(self, tokens: Sequence[int]) -> str:
        """The newly final text after these tokens ("" if none)."""
        return self.detok.push(tokens)

    def flush(self) -> str:
        return self.detok.flush()

    @property
    def finish_reason(self) -> str:
        return "stop" if self.detok.stopped else self.request.result.finish_reason

    def output(self) -> Output:
        self.flush()
        r = self.request.result
        return Output(self.detok.text, list(r.token_ids), list(r.prompt_ids), r.stats(), r, self.finish_reason)


def sampling_config(sampling: dict[str, Any]):
    """Request sampling options (temperature, top_p, top_k, min_p, seed, draft_temperature) -> a SamplingConfig,
    or None for greedy (no temperature or 0: top_p / top_k / seed need one)."""
    from eaglespec.sampling import SamplingConfig, SamplingParams, draft_processors

    opts = {k: v for k, v in sampling.items() if v is not None}
    if not opts.get("temperature"):
        return None
    seed = opts.pop("seed", None)
    draft = draft_processors(opts.pop("draft_temperature", None))  # the drafter's own (0: top-k children)
    try:
        return SamplingConfig(SamplingParams(**opts), seed=seed, draft=draft)
    except TypeError:
        raise EagleSpecError(f"unknown sampling options {sorted(opts)} (temperature, top_k, top_p, min_p, seed, "
                             "draft_temperature)") from None


class TextStream:
    """Incremental detokenization with stop strings: text only leaves once it is final.

    Holds back a trailing incomplete UTF-8 sequence (decoded as U+FFFD) and any suffix that could
    still become a stop string; a stop string cuts the text (it is not included).
    """

    def __init__(self, tokenizer, stop: str | Sequence[str] | None = None):
        self.tokenizer = tokenizer
        self.stop = [stop] if isinstance(stop, str) else [s for s in (stop or []) if s]
        self.token_ids: list[int] = []
        self.text = ""  # emitted so far
        self.stopped = False

    def _decode(self) -> str:
        return self.tokenizer.decode(self.token_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def push(self, tokens: Sequence[int]) -> str:
        """Add a round's tokens; returns the newly final text ("" if none)."""
        if self.stopped:
            return ""
        self.token_ids.extend(tokens)
        full = self._decode()
        cut = min((i for i in (full.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            return self._emit(full, cut)
        limit = len(full.rstrip("\ufffd"))  # an incomplete multi-byte character: wait for more bytes
        hold = 0
        for s in self.stop:  # a suffix that may still grow into a stop string
            for n in range(min(len(s) - 1, limit), hold, -1):
                if full[:limit].endswith(s[:n]):
                    hold = n
                    break
        return self._emit(full, limit - hold)

    def flush(self) -> str:
        """The rest of the text at the end of generation."""
        return "" if self.stopped else self._emit(self._decode(), None)

    def _emit(self, full: str, limit: int | None) -> str:
        new = full[:limit]
        if len(new) <= len(self.text) or not new.startswith(self.text):
            return ""
        piece = new[len(self.text):]
        self.text = new
        return piece


class Stream:
    """One generation in progress: iterate for text pieces; afterwards .text/.token_ids/.finish_reason."""

    def __init__(self, es: EagleSpec, prompt_ids: list[int], max_new_tokens: int,
                 stop: str | Sequence[str] | None, sampling: dict[str, Any]):
        self.es = es
        self.prompt_ids = prompt_ids
        self.result = GenerationResult(list(prompt_ids), [])
        self.detok = TextStream(es.tokenizer, stop)
        self._rounds = es._engine_stream(prompt_ids, max_new_tokens, self.result, sampling)
        self.finish_reason: str | None = None
        self._t0 = time.perf_counter()

    @property
    def text(self) -> str:
        return self.detok.text

    @property
    def token_ids(self) -> list[int]:
        return self.result.token_ids

    def __iter__(self) -> Iterator[str]:
        self.es._owner = self
        try:
            while True:
                if self.es._owner is not self:  # checked before the engine advances
                    raise EagleSpecError("another generation started on this EagleSpec while this one was running: "
                                         "the engine runs one sequence at a time")
                tokens = next(self._rounds, None)
                if tokens is None:
                    break
                piece = self.detok.push(tokens)
                if piece:
                    yield piece
                if self.detok.stopped:
                    break
            piece = self.detok.flush()
            if piece:
                yield piece
            self.finish_reason = "stop" if self.detok.stopped else self.result.finish_reason
        finally:
            self.close()

    def close(self) -> None:
        """Stop generating (e.g. the client went away); the engine is free for the next request."""
        self._rounds.close()
        if self.result.seconds == 0.0:  # stopped early: the engine did not time the run
            self.result.seconds = time.perf_counter() - self._t0
        if self.es._owner is self:
            self.es._owner = None

    def output(self) -> Output:
        return Output(self.text, list(self.result.token_ids), list(self.prompt_ids), self.result.stats(),
                      self.result, self.finish_reason or self.result.finish_reason)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def settle_heap() -> None:
    """Before a timed or long-running loop in a process eaglespec owns (bench, serve): collect the garbage, then
    move every object alive now to the collector's permanent generation (gc.freeze), so that collections during
    the loop do not walk the models' objects and stall the rounds in flight. Objects alive now that later become
    part of a reference cycle are never collected (reference counting still frees the rest)."""
    gc.collect()
    gc.freeze()
