"""Which draft tree pays off for a drafter: tok/s and tau of tree shapes against fast plain decoding.

    python bench/tree_sweep.py [--draft DIR] [--limit 10] [--temperature 0] [--json OUT] [--best-flags]
        [--configs chain:3,chain:5,dynamic:5/8/24,dynamic:8/10/60,static:fit/20] [--fit-json FIT] [--compile]
        [--predict [--profile-json PROFILE]]

Every config runs on the same prompts (fast backend, draft graphs on CUDA). A config is chain:K,
dynamic:DEPTH/TOPK/BUDGET, static:DEPTH/TOPK/BUDGET (EAGLE-1's 25-node static tree cut to DEPTH and BUDGET) or
static:fit/BUDGET (the best BUDGET nodes of a fitted static tree: --fit-json, the --json of
bench/fit_static_tree.py or bench/fit_sampled_tree.py, else the drafter manifest's
tree_defaults.static.choices). The JSON's "best" holds the fastest config of each kind; --best-flags prints
the fastest chain and dynamic shapes as `eaglespec bench` flags on the last line of stdout.

--predict (`--tree auto`'s model, eaglespec.tree.auto): the round costs of this target and drafter on this device
(measured once, cached: engine.calibrate.cached_costs) and the drafter's acceptance profile (--profile-json, the
--json of bench/acceptance_profile.py, else its manifest's acceptance_profile) give each config's predicted tok/s,
tau and ms per round, printed beside the measured ones; the auto choice runs as one more config ("auto:...") and
the last line says how close it came to the fastest grid config measured.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from eaglespec.api import tree_defaults
from eaglespec.cli.args import add_draft_temperature, add_model_args
from eaglespec.cli.bench import Bench, _load, environment, summarize_run
from eaglespec.datasets import load_prompts
from eaglespec.errors import EagleSpecError
from eaglespec.tree import auto as tree_auto
from eaglespec.tree import fit as tree_fit
from eaglespec.tree.core import TreeSpec

DEFAULT_CONFIGS = ("chain:2,chain:3,chain:4,chain:5,dynamic:3/4/8,dynamic:4/4/12,dynamic:4/6/16,dynamic:5/6/24,"
                   "dynamic:5/8/32,dynamic:6/8/48,dynamic:8/10/60")


def parse_config(text: str) -> tuple[str, dict]:
    """'chain:3' -> ('eagle3-chain', {'k': 3}); 'dynamic:5/8/24' -> ('eagle3-dynamic', depth/top_k/budget)."""
    kind, _, rest = text.partition(":")
    try:
        if kind == "chain":
            return "eagle3-chain", {"k": int(rest)}
        if kind == "static" and rest.startswith("fit/"):
            return "eagle3-static", {"fit": True, "budget": int(rest[4:])}
        if kind in ("dynamic", "static"):
            depth, top_k, budget = (int(x) for x in rest.split("/"))
            return f"eagle3-{kind}", {"depth": depth, "top_k": top_k, "budget": budget}
    except ValueError:
        pass
    raise SystemExit(f"--configs: {text!r} is not chain:K, dynamic:DEPTH/TOPK/BUDGET, static:DEPTH/TOPK/BUDGET "
                     "or static:fit/BUDGET")


def static_config(kw: dict, fitted: tuple[tuple[int, ...], ...] | None) -> TreeSpec:
    """A static config's tree: the fitted tree's best `budget` nodes (static:fit/BUDGET), else EAGLE-1's tree
    cut to depth and budget (static:DEPTH/TOPK/BUDGET)."""
    if kw.get("fit"):
        return tree_fit.fitted_spec(fitted, kw["budget"])
    return TreeSpec("static", depth=kw["depth"], top_k=kw["top_k"], budget=kw["budget"])


def config_spec(method: str, kw: dict, fitted: tuple[tuple[int, ...], ...] | None) -> TreeSpec:
    """The tree a config drafts (plain decoding: a chain of 0)."""
    if method == "fast-plain":
        return TreeSpec("chain", depth=0)
    if method == "eagle3-chain":
        return TreeSpec("chain", depth=kw["k"])
    if method == "eagle3-static":
        return static_config(kw, fitted)
    return TreeSpec("dynamic", depth=kw["depth"], top_k=kw["top_k"], budget=kw["budget"])


def auto_config(choice: tree_auto.Prediction) -> tuple[str, str, dict]:
    """(name, method, knobs) of the auto choice as a config ("auto:" + its label); a static choice's tree rides in
    the knobs as "spec"."""
    spec = choice.spec()
    if choice.kind == "plain":
        return "auto:plain", "fast-plain", {}
    if choice.kind == "chain":
        return f"auto:chain:{spec.depth}", "eagle3-chain", {"k": spec.depth}
    if choice.kind == "static":
        return f"auto:static:fit/{spec.budget}", "eagle3-static", {"spec": spec}
    return (f"auto:dynamic:{spec.depth}/{spec.top_k}/{spec.budget}", "eagle3-dynamic",
            {"depth": spec.depth, "top_k": spec.top_k, "budget": spec.budget})


def predictor(args, es, bench) -> tuple[tree_auto.Acceptance, tree_auto.CostModel]:
    """--predict: the acceptance profile at the run's temperature and the cached (else measured) round costs of the
    fast target and the drafter under the run's engine flags."""
    from eaglespec.engine.calibrate import costs_for

    if args.profile_json:
        profile = tree_auto.AcceptanceProfile.from_dict(json.loads(Path(args.profile_json).read_text()),
                                                        args.profile_json)
    else:
        profile = tree_auto.drafter_profile(es.drafter, f"drafter {args.draft}")
    costs = costs_for(bench.fast, es.drafter, es.model, bench.config, args.max_len)
    return profile.acceptance(bool(args.temperature)), costs


def fitted_choices(path: str | None, drafter) -> tuple[tuple[int, ...], ...]:
    """The fitted static tree: the "tree" of fit_static_tree.py's --json, else the drafter's manifest
    choices."""
    if path:
        try:
            return tree_fit.load_fitted(path)
        except EagleSpecError as e:
            raise SystemExit(f"--fit-json {e}") from None
    choices = tree_defaults(drafter).get("static", {}).get("choices")
    if not choices:
        raise SystemExit("static:fit/BUDGET needs --fit-json or a drafter manifest with tree_defaults.static.choices "
                         "(bench/fit_static_tree.py --write)")
    return choices


def prediction_fields(p: tree_auto.Prediction | None) -> dict:
    """A config's predicted tok/s, tau and ms per round ({} without --predict)."""
    if p is None:
        return {}
    return {"predicted_tokens_per_second": round(p.tokens_per_second, 2), "predicted_tau": round(p.tau, 4),
            "predicted_ms_per_round": round(p.round_s * 1e3, 4)}


def round_ms(row: dict) -> float:
    """A config's measured ms per round: its phases' sum (a phase timed inside another counts there)."""
    ms = row.get("ms_per_round") or {}
    return sum(v for v in ms.values() if v is not None)


def best_configs(rows: list[dict]) -> dict[str, dict]:
    """The fastest row (tok/s) of each tree kind: {"chain": row, "dynamic": row, ...}."""
    best: dict[str, dict] = {}
    for r in rows:
        kind = r["config"].partition(":")[0]
        if kind != "plain" and r.get("tokens_per_second", 0) > best.get(kind, {}).get("tokens_per_second", -1):
            best[kind] = r
    return best


def bench_flags(best: dict[str, dict]) -> str:
    """`eaglespec bench` shape flags for the fastest chain and dynamic configs (bench's static tree is the
    drafter's recommendation: tree_defaults.static)."""
    flags = []
    if "chain" in best:
        flags.append(f"--k {best['chain']['config'].partition(':')[2]}")
    if "dynamic" in best:
        depth, top_k, budget = best["dynamic"]["config"].partition(":")[2].split("/")
        flags.append(f"--depth {depth} --top-k {top_k} --budget {budget}")
    return " ".join(flags)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(ap)
    ap.add_argument("--dataset", default="mtbench")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--skip", type=int, default=0, help="leave out the first N prompts (e.g. a fitted tree's)")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=0.0)
    add_draft_temperature(ap)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--configs", default=DEFAULT_CONFIGS)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--max-len", type=int, default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--best-flags", action="store_true", help="print the fastest shapes as bench flags, last")
    ap.add_argument("--fit-json", default=None,
                    help="static:fit configs: the --json of bench/fit_static_tree.py or fit_sampled_tree.py")
    ap.add_argument("--predict", action="store_true",
                    help="print each config's predicted tok/s (--tree auto's model) beside the measured one and run "
                         "the auto choice too")
    ap.add_argument("--profile-json", default=None,
                    help="--predict: the acceptance profile (bench/acceptance_profile.py --json; default: the "
                         "drafter manifest's)")
    args = ap.parse_args()
    configs = [(c, *parse_config(c)) for c in args.configs.split(",") if c.strip()]
    es = _load(args, args.dtype)
    prompts = [es.encode(t) for t in load_prompts(args.dataset, args.limit, skip=args.skip)]
    budget = max([kw.get("budget", 0) for _, _, kw in configs] + [64])
    args.max_len = args.max_len or max(len(p) for p in prompts) + args.max_new_tokens + 2 * budget
    args.k, args.depth, args.top_k, args.budget = 5, 8, 10, 60  # Bench.engine reads these; each config sets its own
    fitted = fitted_choices(args.fit_json, es.drafter) if any(kw.get("fit") for _, _, kw in configs) else None
    bench = Bench(es.model, es.tokenizer, es.drafter, es.eos_ids(), args)
    predicted: dict[str, tree_auto.Prediction] = {}
    if args.predict:
        try:
            acceptance, costs = predictor(args, es, bench)
        except EagleSpecError as e:
            raise SystemExit(f"--predict: {e}") from None
        sampled = bool(args.temperature)
        choice = tree_auto.choose(acceptance, costs, sampled=sampled)
        print(f"auto choice: {choice.summary()}", file=sys.stderr, flush=True)
        configs.append(auto_config(choice))
        for name, method, kw in configs:
            spec = kw["spec"] if "spec" in kw else config_spec(method, kw, fitted)
            predicted[name] = tree_auto.predict(spec, acceptance, costs, sampled=sampled)
        predicted["plain"] = tree_auto.predict(TreeSpec("chain", depth=0), acceptance, costs, sampled=sampled)
    rows = []
    plain = summarize_run(bench.run("fast-plain", prompts, args.max_new_tokens, args.warmup))
    rows.append({"config": "plain", **plain, **prediction_fields(predicted.get("plain"))})
    print(f"plain: {plain['tokens_per_second']:.1f} tok/s", file=sys.stderr, flush=True)
    for name, method, kw in configs:
        for key, value in kw.items():
            if key not in ("fit", "spec"):
                setattr(args, key, value)
        bench.static_override = None if method != "eagle3-static" else kw.get("spec") or static_config(kw, fitted)
        s = summarize_run(bench.run(method, prompts, args.max_new_tokens, args.warmup))
        s["vs_plain"] = round(s.get("tokens_per_second", 0.0) / plain["tokens_per_second"], 3)
        rows.append({"config": name, **s, **prediction_fields(predicted.get(name))})
        print(f"{name}: {s.get('tokens_per_second', 0):.1f} tok/s tau {s.get('tau', 0):.3f} "
              f"x{s['vs_plain']:.2f} ms/round {s.get('ms_per_round')}", file=sys.stderr, flush=True)
    print("| config | tok/s | tau | vs fast plain | draft / verify / accept+commit / other (ms per round) |"
          + (" predicted tok/s | predicted tau | ms per round: measured / predicted |" if predicted else ""))
    print("|---|---|---|---|---|" + ("---|---|---|" if predicted else ""))
    for r in rows:
        ms = r.get("ms_per_round") or {}
        split = " / ".join("-" if v is None else f"{v:.2f}" for v in ms.values()) if ms else ""
        cells = ""
        if predicted:
            cells = (f" {r.get('predicted_tokens_per_second', 0):.1f} | {r.get('predicted_tau', 0):.2f} | "
                     f"{round_ms(r):.3f} / {r.get('predicted_ms_per_round', 0):.3f} |")
        print(f"| {r['config']} | {r.get('tokens_per_second', 0):.1f} | {r.get('tau', 1.0):.2f} | "
              f"{r.get('vs_plain', 1.0):.2f} | {split} |" + cells)
    best = best_configs(rows)
    if predicted:
        auto = rows[-1]
        top = max(rows[:-1], key=lambda r: r.get("tokens_per_second", 0))  # the grid, without the auto run
        print(f"auto choice {auto['config']}: {auto.get('tokens_per_second', 0):.1f} tok/s measured, "
              f"{100 * auto.get('tokens_per_second', 0) / top['tokens_per_second']:.1f}% of the fastest grid config "
              f"({top['config']}, {top['tokens_per_second']:.1f} tok/s); predicted "
              f"{auto['predicted_tokens_per_second']:.1f} tok/s", flush=True)
    if args.json:
        device = next(es.model.parameters()).device
        out = {"environment": environment(device), "temperature": args.temperature,
               "draft_temperature": args.draft_temperature, "prompts": len(prompts),
               "dataset": args.dataset, "compile": args.compile,
               "rows": [{k: v for k, v in r.items() if k != "acceptance_length_hist"} for r in rows],
               "best": {kind: r["config"] for kind, r in best.items()}}
        Path(args.json).write_text(json.dumps(out, indent=1))
    if torch.cuda.is_available():
        print(f"peak GPU memory {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB", file=sys.stderr)
    if args.best_flags:
        print(bench_flags(best), flush=True)


if __name__ == "__main__":
    main()
