"""`eaglespec bench`: one run, one target, several decoding methods, the same prompts.

Methods (--methods, comma separated):
    hf              HF `model.generate` (the baseline a user has today)
    hf-plain        the engine over the generic HF backend, plain decoding
    fast-plain      the engine over the fast backend, plain decoding (budget 0): the in-run baseline
    eagle3-chain    the drafter, a chain of --k tokens, fast backend
    eagle3-static   the drafter, the static tree it recommends (else EAGLE-1's), fast backend
    eagle3-dynamic  the drafter, EAGLE-2 dynamic tree (--depth/--top-k/--budget), fast backend
    eagle3-auto     the drafter, the tree `--tree auto` chooses (tree/auto.py), fast backend; its predicted tok/s
                    is reported beside the measured one
    extra-*         the same three trees with a second drafter (--extra-draft)
Per method: tok/s (all tokens / all seconds, and the median per prompt), tau, speedup ratios vs HF generate and vs
fast plain decoding, the time per round split into draft / verify / accept+commit / other, and, at T=0, greedy
agreement with HF generate: the share of identical sequences and, at each first divergence, the position and the
reference's top-2 logit gap there. A divergence is a bf16 near-tie when that gap is within NEAR_TIE_ULPS bf16 ulps
at the top logit's magnitude (bf16_ulp). --check-fp32 N repeats the agreement check in fp32 with TF32 off.

Timed regions are bracketed by torch.cuda.synchronize(); every method is warmed up first: --warmup prompts for 48
tokens (graph captures), then (--warm-prompts) every other prompt for 2 tokens and the shortest and longest prompt
to full length, so one-time per-shape costs fall on no method's clock.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from eaglespec.checkpoint.drafter import check_draft_dir
from eaglespec.cli.args import (
    add_draft_temperature,
    add_model_args,
    add_tree_args,
    check_model_inputs,
    check_module,
    log,
    non_negative,
    set_threads,
)
from eaglespec.datasets import load_prompts
from eaglespec.engine.timing import sync
from eaglespec.errors import EagleSpecError

EXTRA_METHODS = ("extra-chain", "extra-static", "extra-dynamic")  # the --extra-draft drafter's (EAGLE-1, HASS)
ALL_METHODS = ("hf", "hf-plain", "fast-plain", "eagle3-chain", "eagle3-static", "eagle3-dynamic", "eagle3-auto",
               *EXTRA_METHODS)
DEFAULT_METHODS = "hf,fast-plain,eagle3-chain,eagle3-static,eagle3-dynamic"
NEAR_TIE_ULPS = 4  # a divergence is a bf16 near-tie when the reference's top-2 gap is within this many bf16 ulps
WARM_TOKENS = 2  # --warm-prompts: the prefill's token and one round
PHASES = ("draft", "verify", "accept_commit", "other")


# -- one method over all prompts -----------------------------------------------------------------
@dataclass
class Run:
    method: str
    token_ids: list[list[int]] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    results: list[Any] = field(default_factory=list)  # GenerationResults (engine methods)
    ref_gaps: list[list[float]] = field(default_factory=list)  # hf only: top-2 logit gap per step
    ref_second: list[list[int]] = field(default_factory=list)  # hf only: the runner-up token per step
    ref_top: list[list[float]] = field(default_factory=list)  # hf only: the top logit per step
    round_graphs: bool = False  # the engine ran rounds as CUDA graphs: draft time is inside verify time
    skipped: str = ""


class _Synced:
    """A target proxy that synchronizes before each forward, so that the drafter's queued GPU work is timed as
    draft time instead of leaking into verify time (one extra sync per round). `inner` is the target."""

    def __init__(self, target):
        self.inner = target

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def forward(self, *args, **kwargs):
        sync(self.inner.device)
        return self.inner.forward(*args, **kwargs)


class Bench:
    def __init__(self, model, tokenizer, drafter, eos: list[int], args: argparse.Namespace, extra_drafter=None):
        """extra_drafter: a second drafter (e.g. EAGLE-1 / HASS) for the extra-* methods, on the same target.
        The engine flags in `args` (EngineConfig.from_args) apply to every method; each method names its backend."""
        from eaglespec.backends.fast import unsupported_reason
        from eaglespec.config import EngineConfig
        from eaglespec.engine.build import build_target

        self.model, self.tok, self.drafter, self.eos, self.args = model, tokenizer, drafter, eos, args
        self.extra_drafter = extra_drafter
        self.static_override = None  # a TreeSpec for eagle3-static instead of the drafter's recommendation
        self.auto = None  # eagle3-auto's choice: a tree.auto.Prediction
        self.verbose = bool(getattr(args, "verbose", False))
        self.device = next(model.parameters()).device
        self.config = EngineConfig.from_args(args).replace(
            backend="fast", device=str(self.device), dtype=str(model.dtype).removeprefix("torch."))
        self.switches = self.config.resolve(self.device, fast=True)
        self.fast = None
        self.fast_reason = unsupported_reason(model)
        if self.fast_reason is None:
            ids = tuple(drafter.feature_layer_ids) if drafter is not None else ()
            self.fast = build_target(model, self.config, ids, max_len=args.max_len, compile=args.compile)

    def sampling(self):
        if not self.args.temperature:
            return None
        from eaglespec.sampling import SamplingConfig, SamplingParams, draft_processors

        draft = draft_processors(getattr(self.args, "draft_temperature", None))  # None: the target's processors
        return SamplingConfig(SamplingParams(temperature=self.args.temperature), draft=draft, seed=self.args.seed)

    def engine(self, method: str):
        """(engine, None) or (None, reason to skip)."""
        from eaglespec.api import tree_spec
        from eaglespec.engine.build import build_engine, build_target
        from eaglespec.tree.core import TreeSpec

        a = self.args
        plain = TreeSpec("chain", depth=0)
        if method == "hf-plain":
            return build_engine(build_target(self.model, self.config.replace(backend="hf")), None, plain,
                                self.config), None
        if self.fast is None:
            return None, f"fast backend unavailable: {self.fast_reason}"
        # a sync before each forward would wait for the round launched ahead (overlap) and means nothing inside a
        # round graph
        sw = self.switches
        phase_sync = self.device.type == "cuda" and getattr(a, "phase_sync", True) and not sw.overlap \
            and not sw.round_graphs
        target = _Synced(self.fast) if phase_sync else self.fast
        if method == "fast-plain":
            return build_engine(target, None, plain, self.config), None
        extra = method in EXTRA_METHODS
        drafter = self.extra_drafter if extra else self.drafter
        if drafter is None:
            return None, "no --extra-draft" if extra else "no drafter"
        kind = method.split("-", 1)[1]
        try:
            if kind == "auto":
                spec = self.auto_spec()
            elif kind != "static":
                spec = tree_spec(kind, a.k, a.top_k, a.depth, a.budget)
            else:  # the extra drafter's recommended static tree, else EAGLE-1's
                spec = static_spec(drafter, self.device, bool(a.temperature)) if extra else self.static_spec()
        except (EagleSpecError, NotImplementedError, ValueError) as exc:
            return None, f"{kind} trees unavailable: {exc}"
        return build_engine(target, drafter, spec, self.config, draft_max_len=a.max_len), None

    def static_spec(self):
        """The static tree: `static_override` when set (bench/tree_sweep.py's static configs), else static_spec."""
        if self.static_override is not None:
            return self.static_override
        return static_spec(self.drafter, self.device, bool(self.args.temperature))

    def auto_spec(self):
        """eagle3-auto's tree: tree.auto's choice at the run's temperature for the drafter's acceptance profile and
        the fast target's round costs on this device (cached: engine.calibrate.costs_for), kept in self.auto."""
        from eaglespec.engine.calibrate import costs_for
        from eaglespec.tree.auto import choose, drafter_profile

        sampled = bool(self.args.temperature)
        acceptance = drafter_profile(self.drafter).acceptance(sampled)
        costs = costs_for(self.fast, self.drafter, self.model, self.config, self.args.max_len)
        self.auto = choose(acceptance, costs, sampled=sampled)
        return self.auto.spec()

    def hf_generate(self, ids: list[int], max_new: int, logits: bool):
        x = torch.tensor([ids], device=self.device)
        kw: dict[str, Any] = dict(attention_mask=torch.ones_like(x), max_new_tokens=max_new, min_new_tokens=0,
                                  eos_token_id=self.eos or None, pad_token_id=self.tok.pad_token_id or 0)
        if self.args.temperature:
            kw.update(do_sample=True, temperature=self.args.temperature, top_k=0, top_p=1.0)
        else:
            kw.update(do_sample=False)
        if logits:
            kw.update(output_logits=True, return_dict_in_generate=True)
        out = self.model.generate(x, **kw)
        seq = out.sequences if logits else out
        return seq[0, len(ids):].tolist(), (out.logits if logits else ())

    @staticmethod
    def top2(step_logits) -> tuple[list[float], list[int], list[float]]:
        """Per generated step: the top-2 logit gap, the runner-up token, the top logit (untimed)."""
        if not step_logits:
            return [], [], []
        top = torch.stack([lg[0].float() for lg in step_logits]).topk(2, dim=-1)  # [n, 2]
        return (top.values[:, 0] - top.values[:, 1]).tolist(), top.indices[:, 1].tolist(), top.values[:, 0].tolist()

    def run(self, method: str, prompts: list[list[int]], max_new: int, warmup: int, timed: bool = True) -> Run:
        from eaglespec.api import settle_heap

        run = Run(method)
        if method == "hf":
            for ids in prompts[:warmup]:
                self.hf_generate(ids, 16, logits=False)
            for ids in self._warm_set(prompts, warmup):
                self.hf_generate(ids, WARM_TOKENS, logits=False)
            settle_heap()  # no full collection walks the models during the timed runs
            for i, ids in enumerate(prompts):
                sync(self.device)
                t0 = time.perf_counter()
                toks, step_logits = self.hf_generate(ids, max_new, logits=not self.args.temperature)
                sync(self.device)
                run.seconds.append(time.perf_counter() - t0)
                gaps, second, best = self.top2(step_logits)
                run.token_ids.append(toks)
                run.ref_gaps.append(gaps)
                run.ref_second.append(second)
                run.ref_top.append(best)
                self._progress(method, i, len(prompts), run)
            return run
        engine, reason = self.engine(method)
        if engine is None:
            run.skipped = reason
            log(f"bench: skipping {method}: {reason}")
            return run
        run.round_graphs = getattr(engine, "graphs", None) is not None
        sampling = self.sampling()
        try:
            for ids in prompts[:warmup]:  # captures the CUDA graphs this method's shapes need
                engine.generate(ids, 48, self.eos, sampling)
            for ids in self._warm_set(prompts, warmup):  # every prompt's prefill / catch-up shape, once
                engine.generate(ids, WARM_TOKENS, self.eos, sampling)
            for ids in self._span_set(prompts):  # every KV span the timed runs reach (graphs captured per span)
                engine.generate(ids, max_new, self.eos, sampling)
        except NotImplementedError as exc:
            run.skipped = f"not implemented: {exc}"
            log(f"bench: skipping {method}: {run.skipped}")
            return run
        settle_heap()  # no full collection walks the models and the graphs during the timed runs
        for i, ids in enumerate(prompts):
            sync(self.device)
            t0 = time.perf_counter()
            res = engine.generate(ids, max_new, self.eos, sampling)  # sampling None: greedy
            sync(self.device)
            run.seconds.append(time.perf_counter() - t0)
            res.seconds = run.seconds[-1]
            for r in res.rounds:  # keep what the report needs; drop per-round tensor references
                if getattr(r, "detail", None):
                    r.detail = {k: v for k, v in r.detail.items() if k in ("parents", "depths", "rows", "tree_stats")}
            run.token_ids.append(res.token_ids)
            run.results.append(res)
            self._progress(method, i, len(prompts), run)
        return run

    def _warm_set(self, prompts: list[list[int]], warmup: int) -> list[list[int]]:
        """--warm-prompts: the prompts not warmed yet (a prefill and one round each). Without it, whichever
        method runs first pays the per-shape first-sight costs of every prompt length."""
        return prompts[warmup:] if getattr(self.args, "warm_prompts", True) else []

    def _span_set(self, prompts: list[list[int]]) -> list[list[int]]:
        """--warm-prompts: the shortest and the longest prompt, to be run to full length untimed. Spans (KV slots
        attended) step every 256 slots and each (span, shape) has its own CUDA graph: between them these two runs
        reach every span the timed runs reach, so no capture lands in a timed run."""
        if not getattr(self.args, "warm_prompts", True) or not prompts:
            return []
        short, long = min(prompts, key=len), max(prompts, key=len)
        return [short] if short is long else [short, long]

    def _progress(self, method: str, i: int, n: int, run: Run) -> None:
        """With -v, a line every 10 prompts and at the end."""
        if self.verbose and (i == n - 1 or (i + 1) % 10 == 0):
            toks = sum(len(t) for t in run.token_ids)
            log(f"bench: {method}: {i + 1}/{n} prompts, {toks / sum(run.seconds):.1f} tok/s")


# -- summaries ----------------------------------------------------------------------------------
def bf16_ulp(x: float) -> float:
    """The spacing of bfloat16 numbers at |x|: 2**(floor(log2|x|) - 7), bfloat16 keeping 8 significant bits
    (0.125 for |x| in [16, 32)); below the smallest normal number, the spacing there."""
    _, e = math.frexp(max(abs(x), 2.0 ** -126))  # |x| = m * 2**e with 0.5 <= m < 1: floor(log2|x|) = e - 1
    return math.ldexp(1.0, e - 1 - 7)


def near_tie(gap: float, top: float) -> bool:
    """Whether a top-2 logit gap is a bf16 near-tie: gap <= NEAR_TIE_ULPS * bf16_ulp(top logit)."""
    return gap <= NEAR_TIE_ULPS * bf16_ulp(top)


def agreement(ref: Run, run: Run) -> dict:
    """Share of sequences identical to the reference's (HF generate; fast-plain for same_text_as_fast_plain); each
    first divergence with the reference's top-2 logit gap there where it recorded logits: absolute, in bf16 ulps at
    the top logit, and whether it is a near-tie (near_tie). Divergences without recorded logits are unmeasured."""
    same, divs = 0, []
    for i, (a, b) in enumerate(zip(ref.token_ids, run.token_ids)):
        if a == b:
            same += 1
            continue
        p = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        gap = ref.ref_gaps[i][p] if ref.ref_gaps and p < len(ref.ref_gaps[i]) else None
        second = ref.ref_second[i][p] if ref.ref_second and p < len(ref.ref_second[i]) else None
        top = ref.ref_top[i][p] if ref.ref_top and p < len(ref.ref_top[i]) else None
        measured = gap is not None and top is not None
        divs.append({"prompt": i, "position": p, "ref_top2_gap": None if gap is None else round(gap, 5),
                     "ref_top_logit": None if top is None else round(top, 4),
                     "gap_in_bf16_ulps": round(gap / bf16_ulp(top), 2) if measured else None,
                     "near_tie": near_tie(gap, top) if measured else None,
                     "ref_token": a[p] if p < len(a) else None, "token": b[p] if p < len(b) else None,
                     "took_ref_runner_up": second is not None and p < len(b) and b[p] == second})
    n = min(len(ref.token_ids), len(run.token_ids))  # the prompts both ran (--hf-limit)
    near = sum(1 for d in divs if d["near_tie"] is True)
    far = sum(1 for d in divs if d["near_tie"] is False)
    return {"sequences": n, "identical": same, "identical_rate": round(same / n, 4) if n else 0.0,
            "divergences": divs, "near_ties": near, "non_near_ties": far, "unmeasured": len(divs) - near - far}


def summarize_run(run: Run) -> dict:
    """tok/s, tau, acceptance and the time per round of one method's run. With round graphs the draft phase is
    timed inside verify: its entries are None and `folded` says where it went."""
    toks = [len(t) for t in run.token_ids]
    out: dict[str, Any] = {"method": run.method}
    if run.skipped:
        out["skipped"] = run.skipped
        return out
    total_s = sum(run.seconds)
    out.update(prompts=len(toks), new_tokens=sum(toks), seconds=round(total_s, 4),
               tokens_per_second=round(sum(toks) / total_s, 2) if total_s else 0.0,
               median_tokens_per_second=round(statistics.median(n / s for n, s in zip(toks, run.seconds)), 2))
    if run.results:
        from eaglespec.telemetry import summarize

        s = summarize(run.results)
        split = s["time_split"]
        tot = sum(split.values()) or 1.0
        rounds = max(s["rounds"], 1)
        share = {k: round(v / tot, 4) for k, v in split.items()}
        per_round = {k: round(1000 * v / rounds, 4) for k, v in split.items()}
        if run.round_graphs:
            out["folded"] = {"draft": "verify"}
            for d in (split, share, per_round):
                d["draft"] = None
        out.update(tau=s["tau"], rounds=s["rounds"], drafted=s["drafted"], accepted=s["accepted"],
                   acceptance_length_hist=s["acceptance_length_hist"],
                   acceptance_by_depth=s["acceptance_by_depth"],
                   time_split_s=split, time_share=share, ms_per_round=per_round,
                   backend=run.results[0].backend)
    return out


def _tokens_per_second(run: Run, n: int) -> float:
    """Aggregate tok/s over the run's first n prompts."""
    secs = sum(run.seconds[:n])
    return sum(len(t) for t in run.token_ids[:n]) / secs if secs else 0.0


def add_ratios(summaries: dict[str, dict], runs: dict[str, Run]) -> None:
    """Speedups as ratios within this run: aggregate tok/s and the median of per-prompt ratios, both over
    the prompts the baseline ran (HF generate may run on the first --hf-limit prompts only)."""
    for base in ("hf", "fast-plain"):
        b = summaries.get(base)
        if not b or "tokens_per_second" not in b:
            continue
        n = len(runs[base].token_ids)
        for name, s in summaries.items():
            if "tokens_per_second" not in s:
                continue
            s[f"speedup_vs_{base}"] = round(_tokens_per_second(runs[name], n) / b["tokens_per_second"], 3)
            per = [(len(t) / sec) / (len(bt) / bsec) for t, sec, bt, bsec in
                   zip(runs[name].token_ids, runs[name].seconds, runs[base].token_ids, runs[base].seconds)
                   if len(t) and len(bt)]
            if per:
                s[f"median_speedup_vs_{base}"] = round(statistics.median(per), 3)


def git_commit() -> str:
    """`git rev-parse --short HEAD` (+dirty with local changes) of the checkout this package runs from; "unknown"
    when it runs from an installed copy."""
    root = Path(__file__).resolve().parents[3]
    if not (root / ".git").exists() or not (root / "src" / "eaglespec").is_dir():
        return "unknown"
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=root,
                                timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=root, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (commit + ("+dirty" if dirty else "")) or "unknown"


def environment(device: torch.device, commit: str | None = None) -> dict:
    """Device, versions, commit (`commit`, else git_commit()) and date, for a report."""
    import transformers

    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({platform.processor() or 'cpu'}, " \
        f"{torch.get_num_threads()} threads)"
    return {"device": gpu, "torch": torch.__version__, "transformers": transformers.__version__,
            "commit": commit or git_commit(), "python": platform.python_version(),
            "date": datetime.datetime.now().isoformat(timespec="seconds")}


def _notes(cfg: dict) -> str:
    """The run's settings that shape its numbers, as '; '-joined clauses."""
    notes = [
        f"extra-* methods: {cfg['extra_draft']}" if cfg.get("extra_draft") else "",
        f"HF generate on the first {cfg['hf_prompts']} prompts only (ratios vs HF and identity over those)"
        if 0 < cfg.get("hf_prompts", 0) < cfg["prompts"] else "",
        "fused Triton kernels" if cfg.get("fused_kernels") else "",
        "no sync before verify (--no-phase-sync: the draft / verify split is blurred)"
        if cfg.get("phase_sync") is False else "",
        "overlap (each round or plain step launched before the host reads the one before it)"
        if cfg.get("overlap") else "",
        "chunked prefill (prompts past the largest bucket in captured chunks)" if cfg.get("chunked_prefill") else "",
        "--adaptive (plain steps where drafting cost more per token)" if cfg.get("adaptive") else "",
        "round graphs (one CUDA graph and one host sync per round)" if cfg.get("round_graphs") else "",
    ]
    return "".join(f"; {n}" for n in notes if n)


def _phase_cells(s: dict) -> str:
    """draft / verify / accept+commit / other in ms per round; a phase timed inside another reads '-'."""
    ms = s.get("ms_per_round")
    if not ms:
        return ""
    return " / ".join("-" if ms[k] is None else f"{ms[k]:.2f}" for k in PHASES)


def markdown(report: dict) -> str:
    """The report as Markdown: the run's settings, one table row per method, footnotes."""
    env, cfg, methods = report["environment"], report["config"], report["methods"]
    lines = [f"\n## bench {env['date']}: {cfg['target']} on {env['device']}\n",
             f"torch {env['torch']}, transformers {env['transformers']}, commit {env['commit']}; "
             f"dataset {cfg['dataset']} ({cfg['prompts']} prompts"
             + (f" after the first {cfg['skip']}" if cfg.get("skip") else "")
             + f", chat template), max {cfg['max_new_tokens']} new tokens, batch 1, {cfg['dtype']}, "
             f"T={cfg['temperature']}"
             + (f" (drafter at T={cfg['draft_temperature']})" if cfg.get("draft_temperature") is not None else "")
             + f"; drafter: {cfg['draft']}; "
             f"chain k={cfg['k']}, dynamic depth {cfg['depth']} top-k {cfg['top_k']} budget {cfg['budget']}"
             + (f", static tree {cfg['static']}" if cfg.get("static") else "")
             + _notes(cfg) + ".\n",
             "| method | backend | tok/s | median tok/s | tau | vs HF generate | vs fast plain | "
             "draft / verify / accept+commit / other (ms per round) | identical to HF | divergences (near-ties) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in methods.items():
        if "skipped" in s:
            lines.append(f"| {name} | skipped: {s['skipped']} | | | | | | | | |")
            continue
        ag = s.get("agreement")
        ident = f"{ag['identical']}/{ag['sequences']}" if ag else ""
        divs = f"{len(ag['divergences'])} ({ag['near_ties']})" if ag else ""
        lines.append(f"| {name} | {s.get('backend', 'hf generate')} | {s['tokens_per_second']:.1f} | "
                     f"{s['median_tokens_per_second']:.1f} | {s.get('tau', '')} | {s.get('speedup_vs_hf', '')} | "
                     f"{s.get('speedup_vs_fast-plain', '')} | {_phase_cells(s)} | {ident} | {divs} |")
    notes = []
    if any("folded" in s for s in methods.values()):
        notes.append("draft -: draft is timed inside verify (round graphs: a round is one graph replay)"
                     + ("; accept+commit is the host's work on a round, done while the next one runs"
                        if cfg.get("overlap") else "") + ".")
    if any("agreement" in s for s in methods.values()):
        notes.append(f"near-ties: first divergences where the reference's top-2 logit gap is within {NEAR_TIE_ULPS} "
                     "bf16 ulps at the top logit's magnitude (gap <= 4 * 2**(floor(log2|top|) - 7)).")
    for name, s in methods.items():
        if "predicted_tokens_per_second" in s:
            notes.append(f"{name} drafts {s['tree']} (--tree auto): predicted {s['predicted_tokens_per_second']:.1f} "
                         f"tok/s at tau {s['predicted_tau']:.2f}; measured {s['tokens_per_second']:.1f} tok/s at tau "
                         f"{s.get('tau', '')}.")
    if notes:
        lines.append("")
        lines += notes
    same = [f"{name} {s['same_text_as_fast_plain']['identical']}/{s['same_text_as_fast_plain']['sequences']}"
            for name, s in methods.items() if "same_text_as_fast_plain" in s]
    if same:
        lines.append("\nSequences identical to fast-plain's (an A/B of drafters is paired where they all are): "
                     + ", ".join(same) + ".")
    fp = report.get("fp32_check")
    if fp:
        parts = [f"{m} {a['identical']}/{a['sequences']}" for m, a in fp["agreement"].items()]
        lines.append(f"\nfp32 (TF32 off) check on {fp['prompts']} prompts, identical to HF generate in fp32: "
                     + ", ".join(parts) + ".")
    return "\n".join(lines) + "\n"


def plot(report: dict, path: str | Path) -> Path:
    """Acceptance-length histograms (one per speculative method) and tok/s per method."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    ms = {k: v for k, v in report["methods"].items() if "tokens_per_second" in v}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    spec = [k for k, v in ms.items() if v.get("drafted")]
    width = 0.8 / max(len(spec), 1)
    for i, name in enumerate(spec):
        hist = ms[name]["acceptance_length_hist"]
        total = sum(hist.values()) or 1
        xs = [int(x) for x in hist]
        ax1.bar([x + (i - (len(spec) - 1) / 2) * width for x in xs], [hist[str(x)] / total for x in xs], width,
                label=f"{name} (tau {ms[name]['tau']:.2f})")
    ax1.set_xlabel("tokens emitted per verification (accepted drafts + bonus)")
    ax1.set_ylabel("share of rounds")
    ax1.set_title("acceptance length")
    if spec:
        ax1.legend(fontsize=8)
    names = list(ms)
    vals = [ms[n]["tokens_per_second"] for n in names]
    bars = ax2.bar(names, vals, color="#3b75af")
    for bar, n in zip(bars, names):
        r = ms[n].get("speedup_vs_hf")
        ax2.annotate(f"{bar.get_height():.0f}" + (f"\n{r:.1f}x" if r else ""), (bar.get_x() + bar.get_width() / 2,
                     bar.get_height()), ha="center", va="bottom", fontsize=8)
    ax2.set_ylabel("tokens / s")
    ax2.set_title("throughput (batch 1)")
    ax2.tick_params(axis="x", labelrotation=20)
    env, cfg = report["environment"], report["config"]
    fig.suptitle(f"{cfg['target']} on {env['device']}, {cfg['dataset']} ({cfg['prompts']} prompts), {cfg['dtype']}, "
                 f"T={cfg['temperature']}, commit {env['commit']}", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


# -- the command --------------------------------------------------------------------------------
def _methods(text: str) -> list[str]:
    names = [m.strip() for m in text.split(",") if m.strip()]
    for m in names:
        if m not in ALL_METHODS:
            raise EagleSpecError(f"--methods: {m!r} is not one of {', '.join(ALL_METHODS)}")
    return names


def bench_methods(args: argparse.Namespace) -> list[str]:
    """The methods one bench run measures: --methods, plus the extra-* ones when --extra-draft is given, less HF
    generate when --hf-limit is 0 (no prompts for it; the ratios vs HF and the identity check then have none)."""
    methods = _methods(args.methods)
    if getattr(args, "extra_draft", None) and not any(m in EXTRA_METHODS for m in methods):
        methods += list(EXTRA_METHODS)  # --extra-draft given: its methods join the run
    if getattr(args, "hf_limit", None) == 0 and "hf" in methods:
        methods.remove("hf")
    return methods


def _load(args, dtype):
    """The target and drafter named by args, in `dtype` (Bench builds each method's engine)."""
    from eaglespec.api import EagleSpec

    return EagleSpec.from_args(args, dtype=dtype, backend="hf", draft_graphs=False, round_graphs=False)


def static_spec(drafter, device: torch.device | str | None = None, sampled: bool = False):
    """eagle3-static's tree: the drafter's recommendation on `device` (tree_defaults.static: a fitted tree's
    `choices`, its depth and budget; with `sampled`, a run with a temperature, the sampled policy's shape), else
    EAGLE-1's 25-node tree. The --depth/--top-k/--budget flags shape the dynamic tree only."""
    from eaglespec.api import tree_defaults, tree_spec

    found = tree_defaults(drafter, device=device, sampled=sampled, greedy=not sampled) if drafter is not None else {}
    return tree_spec("static", defaults=found)


def static_label(drafter, device: torch.device | str | None = None, sampled: bool = False) -> str:
    """The static tree eagle3-static drafts, e.g. "25 nodes, depth 5 (EAGLE-1's)"."""
    if drafter is None:
        return ""
    spec = static_spec(drafter, device, sampled)
    choices = spec.static_choices()
    return (f"{len(choices)} nodes, depth {max(map(len, choices))} "
            + ("(fitted to the drafter)" if spec.choices is not None else "(EAGLE-1's)"))


def resolve_tree_args(args, drafter, device: torch.device | str | None = None) -> None:
    """--k/--depth/--top-k/--budget left out -> the drafter's recommended shapes on `device` (tree_defaults; with
    --temperature, the sampled policy's shape too), else the generic defaults; written back into args so the
    report names the shapes that ran."""
    from eaglespec.api import tree_defaults, tree_spec

    sampled = bool(getattr(args, "temperature", 0))
    found = tree_defaults(drafter, device=device, sampled=sampled, greedy=not sampled) if drafter is not None else {}
    chain = tree_spec("chain", args.k, defaults=found)
    tree = tree_spec("dynamic", None, args.top_k, args.depth, args.budget, defaults=found)
    args.k, args.depth, args.top_k, args.budget = chain.depth, tree.depth, tree.top_k, tree.budget


def extra_drafter(es, args) -> tuple[Any, str]:
    """(the --extra-draft drafter for es's target, its description), or (None, "") without the flag."""
    path = getattr(args, "extra_draft", None)
    if not path:
        return None, ""
    from eaglespec.api import load_drafter_for

    return load_drafter_for(es.model, es.tokenizer, path, args.aux_rule, getattr(args, "strict", False))


def run_methods(es, prompts: list[list[int]], methods: list[str], args, extra=None) -> tuple[dict, dict]:
    """Every method over the prompts; (summaries, runs). extra: the --extra-draft drafter for es's target (loaded
    here when an extra-* method needs it)."""
    if extra is None and any(m in EXTRA_METHODS for m in methods):
        extra = extra_drafter(es, args)[0]
    bench = Bench(es.model, es.tokenizer, es.drafter, es.eos_ids(), args, extra)
    runs: dict[str, Run] = {}
    hf_limit = getattr(args, "hf_limit", None)
    for m in methods:
        if bench.verbose:
            log(f"bench: {m} ...")
        mine = prompts[:hf_limit] if m == "hf" and hf_limit else prompts
        runs[m] = bench.run(m, mine, args.max_new_tokens, args.warmup)
    summaries = {m: summarize_run(r) for m, r in runs.items()}
    if bench.auto is not None and "tokens_per_second" in summaries.get("eagle3-auto", {}):
        summaries["eagle3-auto"].update(tree=bench.auto.label(), predicted_tau=round(bench.auto.tau, 4),
                                        predicted_tokens_per_second=round(bench.auto.tokens_per_second, 2))
    add_ratios(summaries, runs)
    if "hf" in runs and not args.temperature:
        for m, r in runs.items():
            if m != "hf" and not r.skipped:
                summaries[m]["agreement"] = agreement(runs["hf"], r)
    if "fast-plain" in runs and not args.temperature:  # did an A/B of drafters compare the same texts? (fp32: it
        for m, r in runs.items():                       # should; bf16: near-ties part them)
            if m not in ("hf", "fast-plain") and not r.skipped:
                ag = agreement(runs["fast-plain"], r)
                summaries[m]["same_text_as_fast_plain"] = {k: ag[k] for k in ("sequences", "identical")}
    return summaries, runs


def check_bench_inputs(args: argparse.Namespace):
    """Every flag of `bench` checked, and the prompts read, before anything loads; returns (EngineConfig,
    methods, prompt texts)."""
    non_negative(args, "limit", "max_new_tokens", "check_fp32", "warmup", "hf_limit", "skip")
    if args.backend is not None:
        raise EagleSpecError("--backend: bench's methods name their backends (--methods)")
    methods = bench_methods(args)
    config = check_model_inputs(args)
    check_draft_dir(args.extra_draft, "--extra-draft")
    if args.plot:
        check_module("matplotlib", "plot", "--plot")
    return config, methods, load_prompts(args.dataset, args.limit, skip=args.skip)


def cmd_bench(args: argparse.Namespace) -> int:
    from eaglespec.backends.loading import resolve_device

    config, methods, texts = check_bench_inputs(args)
    device = torch.device(resolve_device(config.device))
    set_threads(config, args.verbose)
    es = _load(args, args.dtype)
    if args.verbose:
        log(f"bench: {es.draft_note}")
    extra, extra_note = extra_drafter(es, args)  # loaded before any timing: a bad --extra-draft fails at once
    if extra_note and args.verbose:
        log(f"bench: extra-*: {extra_note}")
    resolve_tree_args(args, es.drafter, device)
    prompts = [es.encode(t) for t in texts]
    if args.max_len is None:
        args.max_len = max(len(p) for p in prompts) + args.max_new_tokens + 2 * max(args.budget, 64)
    if device.type == "cuda" and str(es.model.dtype) == "torch.float32":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    summaries, _ = run_methods(es, prompts, methods, args, extra)
    del extra
    sw = config.resolve(device, fast=True)
    report: dict[str, Any] = {
        "environment": environment(device, args.commit),
        "config": {"target": args.target or "SmolLM2-135M-Instruct", "draft": es.draft_note,
                   "dataset": args.dataset, "skip": args.skip, "prompts": len(prompts),
                   "max_new_tokens": args.max_new_tokens,
                   "hf_prompts": min(len(prompts), args.hf_limit or len(prompts)) if "hf" in methods else 0,
                   "dtype": str(es.model.dtype).replace("torch.", ""), "temperature": args.temperature,
                   "draft_temperature": args.draft_temperature,
                   "k": args.k, "depth": args.depth, "top_k": args.top_k, "budget": args.budget,
                   "static": static_label(es.drafter, device, bool(args.temperature)),
                   "extra_draft": extra_note,
                   "methods": methods, "compile": args.compile, "max_len": args.max_len,
                   "phase_sync": args.phase_sync, "adaptive": args.adaptive,
                   "draft_graphs": sw.draft_graphs, "round_graphs": sw.round_graphs, "overlap": sw.overlap,
                   "chunked_prefill": sw.chunked_prefill, "fused_kernels": sw.kernels and not args.compile},
        "methods": summaries,
    }
    if args.check_fp32 and not args.temperature:
        del es
        if device.type == "cuda":
            torch.cuda.empty_cache()
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        if args.verbose:
            log(f"bench: fp32 check (TF32 off) on {args.check_fp32} prompts ...")
        es32 = _load(args, "float32")
        sub = [es32.encode(t) for t in texts[: args.check_fp32]]
        check = [m for m in methods if m != "hf"]
        s32, _ = run_methods(es32, sub, ["hf", *check], argparse.Namespace(**{**vars(args), "warmup": 1}))
        report["fp32_check"] = {"prompts": len(sub), "tf32": False,
                                "agreement": {m: s32[m]["agreement"] for m in check if "agreement" in s32[m]},
                                "tokens_per_second": {m: s.get("tokens_per_second") for m, s in s32.items()}}
    text = markdown(report)
    print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1))
    if args.plot:
        plot(report, args.plot)
    if args.results:
        path = Path(args.results)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(text)
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "bench", help="benchmark HF generate, plain fast decoding and EAGLE-3 in one run",
        description="Time several decoding methods on the same prompts in one process and print a Markdown table: "
                    "tok/s, tau, ratios, the time per round by phase and greedy identity with HF generate. The "
                    "engine flags apply to every method; --backend does not (each method names its backend).")
    add_model_args(p)
    p.add_argument("--dataset", default="mtbench",
                   help="mtbench | humaneval | FILE (.jsonl with 'prompt', or text, one a line); default mtbench")
    p.add_argument("--limit", type=int, default=None, help="use the first N prompts (after --skip; default: all)")
    p.add_argument("--skip", type=int, default=0, metavar="N",
                   help="leave out the first N prompts (split one long run into calls; default 0)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="new tokens per prompt (default 256)")
    p.add_argument("--methods", default=DEFAULT_METHODS,
                   help=f"comma separated, from {', '.join(ALL_METHODS)} (default {DEFAULT_METHODS})")
    p.add_argument("--extra-draft", default=None, metavar="DIR",
                   help="a second drafter (e.g. EAGLE-1 or HASS) measured in the same run as extra-chain / "
                        "extra-static / extra-dynamic (added to --methods unless it names some)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    add_draft_temperature(p)
    p.add_argument("--seed", type=int, default=0, help="random seed of the sampling (default 0)")
    add_tree_args(p, policy=False)  # --k for the chain; --depth/--top-k/--budget for the trees
    p.add_argument("--warmup", type=int, default=2, help="warm-up prompts per method (default 2)")
    p.add_argument("--warm-prompts", action=argparse.BooleanOptionalAction, default=True,
                   help="before timing a method, run each remaining prompt for 2 tokens and the shortest and longest "
                        "to full length, so no method pays another's first-sight costs (default on)")
    p.add_argument("--phase-sync", action=argparse.BooleanOptionalAction, default=True,
                   help="on CUDA without overlap or round graphs, synchronize before each verify forward so that the "
                        "drafter's queued GPU work counts as draft time (default on)")
    p.add_argument("--hf-limit", type=int, default=None, metavar="N",
                   help="run the slow HF generate baseline on the first N prompts only (ratios vs HF use those; 0 "
                        "leaves it out; default: all)")
    p.add_argument("--max-len", type=int, default=None, help="fast backend KV slots (default: fits the prompts)")
    p.add_argument("--compile", action="store_true", help="torch.compile the fast step before CUDA-graph capture")
    p.add_argument("--check-fp32", type=int, default=0, metavar="N",
                   help="also check greedy identity in fp32 with TF32 off on the first N prompts (default 0: off)")
    p.add_argument("--json", default=None, metavar="OUT", help="write the full report as JSON")
    p.add_argument("--plot", default=None, metavar="OUT.png", help="write acceptance histograms and tok/s (PNG)")
    p.add_argument("--results", default=None, metavar="FILE",
                   help="append the Markdown table to FILE (default: only print it)")
    p.add_argument("--commit", default=None,
                   help="the commit the report names (default: git rev-parse --short HEAD of the checkout eaglespec "
                        "runs from, +dirty with local changes; unknown for an installed copy)")
    p.set_defaults(func=cmd_bench)
