"""Telemetry: does speculation pay on this model, and where does the time go?

The engine stores, per round, a small `detail` dict (`round_detail`): the draft tree's parents,
depths and path values (logq) and the accepted rows. `summarize(results)` turns a list of
GenerationResults into one JSON-able summary:

- acceptance length histogram (tokens emitted per verification = accepted drafts + 1)
- acceptance rate by tree depth (reach rate, and the rate conditional on the parent's acceptance)
- calibration: draft confidence buckets vs the observed acceptance of the nodes the target tested
- time split: draft / verify / accept+commit / other (prefill, sampling, detokenizing, Python)
- tree nodes expanded / kept / verified per round; temporary KV bytes (draft and target)
- for mixture-of-experts targets: distinct experts touched per verification (`ExpertTracker`)

`format_report(summary)` renders a text table; `plot_report(summary, path)` a PNG (matplotlib, Agg);
`run_report(es, prompts, ...)` generates for each prompt and summarizes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

CONF_EDGES = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


# -- per round (called by the engine) -----------------------------------------------------------
def round_detail(tree, rows: torch.Tensor) -> dict:
    """What telemetry needs from one round: tensors kept as references (no host sync here).

    tree: the DraftTree verified this round (node 0 = root); rows: [m+1] accepted flattened rows
    (flatten keeps node order, so rows are node indices).
    """
    return {"parents": tree.parents, "depths": tree.depths, "tokens": tree.tokens, "logq": tree.logq,
            "draft_probs": tree.draft_probs, "rows": rows, "tree_stats": dict(tree.stats)}


def node_confidence(detail: dict) -> list[float] | None:
    """Draft confidence of each node (the drafter's probability of the node given its parent)."""
    parents = detail["parents"].tolist()
    logq = detail.get("logq")
    if logq is not None:
        lq = logq.float().tolist()
        return [math.exp(min(0.0, lq[i] - lq[parents[i]])) if i else 1.0 for i in range(len(parents))]
    probs = detail.get("draft_probs")
    if probs is not None and probs.dim() == 2:
        tokens = detail["tokens"].tolist()
        conf = [1.0]
        for i in range(1, len(parents)):
            row = probs[parents[i]]
            conf.append(float(row[tokens[i]]) if tokens[i] < row.shape[0] else float("nan"))
        return conf
    return None


# -- summary over runs --------------------------------------------------------------------------
def kv_row_bytes(model: nn.Module | None) -> int:
    """Bytes of K+V for one sequence position across all layers of a HF model (0 if unknown)."""
    if model is None:
        return 0
    c = getattr(model, "config", None)
    c = c.get_text_config() if hasattr(c, "get_text_config") else c
    cfg = getattr(model, "cfg", None)  # an eaglespec drafter
    try:
        param = next(model.parameters())
    except StopIteration:
        return 0
    elem = param.element_size()
    if c is not None and hasattr(c, "num_hidden_layers"):
        heads = c.num_attention_heads
        kv = getattr(c, "num_key_value_heads", None) or heads
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
        return 2 * c.num_hidden_layers * kv * head_dim * elem
    if cfg is not None and hasattr(cfg, "num_key_value_heads"):
        layers = getattr(cfg, "num_hidden_layers", 1) or 1
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return 2 * layers * cfg.num_key_value_heads * head_dim * elem
    return 0


def _hist(values: Sequence[int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in sorted(values):
        out[str(v)] = out.get(str(v), 0) + 1
    return out


def summarize(results: Sequence[Any], target: nn.Module | None = None, drafter: nn.Module | None = None,
              experts: Sequence[int] | None = None) -> dict:
    """One JSON-able summary of GenerationResults (one run = many requests, or one request).

    target/drafter: the models, for KV byte sizes; experts: distinct experts touched per
    verification forward (ExpertTracker.per_forward without the prefills), for MoE targets.
    """
    target_row, draft_row = kv_row_bytes(target), kv_row_bytes(drafter)
    accept_lens: list[int] = []
    per_request: list[dict] = []
    depth_reached: dict[int, int] = {}  # depth -> rounds whose accepted path reached it
    depth_tested: dict[int, int] = {}  # depth -> rounds with a node at this depth whose parent was accepted
    depth_offered: dict[int, int] = {}  # depth -> rounds that drafted a node at this depth
    buckets = [[0, 0, 0.0] for _ in range(len(CONF_EDGES) - 1)]  # [tested, accepted, sum conf]
    nodes = {"expanded": 0, "kept": 0, "verified": 0}
    kv = {"target_temp_bytes_max": 0, "target_temp_bytes_total": 0, "draft_temp_bytes_max": 0,
          "draft_temp_bytes_total": 0}
    times = {"draft": 0.0, "verify": 0.0, "accept_commit": 0.0, "other": 0.0}
    n_rounds = n_tokens = n_drafted = n_accepted = 0
    total_s = 0.0
    for res in results:
        rounds = res.rounds
        lens = [r.accepted + 1 for r in rounds]
        accept_lens += lens
        n_rounds += len(rounds)
        n_tokens += len(res.token_ids)
        n_drafted += sum(r.drafted for r in rounds)
        n_accepted += sum(r.accepted for r in rounds)
        d, v, c = (sum(r.draft_s for r in rounds), sum(r.verify_s for r in rounds),
                   sum(r.commit_s for r in rounds))
        times["draft"] += d
        times["verify"] += v
        times["accept_commit"] += c
        times["other"] += max(0.0, res.seconds - d - v - c)
        total_s += res.seconds
        per_request.append({"new_tokens": len(res.token_ids), "rounds": len(rounds),
                            "tau": round(res.tau, 4), "seconds": round(res.seconds, 4),
                            "acceptance_length_hist": _hist(lens)})
        for r in rounds:
            det = r.detail
            if not det:
                continue
            parents = det["parents"].tolist()
            depths = det["depths"].tolist()
            accepted = set(det["rows"].tolist())
            conf = node_confidence(det)
            st = det.get("tree_stats") or {}
            n_nodes = len(parents) - 1
            nodes["verified"] += n_nodes
            nodes["kept"] += int(st.get("kept", n_nodes))
            nodes["expanded"] += int(st.get("expanded", n_nodes))
            t_bytes = len(parents) * target_row
            d_bytes = int(st.get("draft_rows", max(0, max(depths) - 1) if n_nodes else 0)) * draft_row
            kv["target_temp_bytes_total"] += t_bytes
            kv["target_temp_bytes_max"] = max(kv["target_temp_bytes_max"], t_bytes)
            kv["draft_temp_bytes_total"] += d_bytes
            kv["draft_temp_bytes_max"] = max(kv["draft_temp_bytes_max"], d_bytes)
            seen_depths = set()
            tested_depths = set()
            for i in range(1, len(parents)):
                seen_depths.add(depths[i])
                if parents[i] not in accepted:
                    continue  # never tested: its parent was rejected
                tested_depths.add(depths[i])
                if conf is not None and not math.isnan(conf[i]):
                    b = min(int(conf[i] * (len(CONF_EDGES) - 1) + 1e-5), len(CONF_EDGES) - 2)  # fp32 at edges
                    buckets[b][0] += 1
                    buckets[b][1] += int(i in accepted)
                    buckets[b][2] += conf[i]
            for dep in seen_depths:
                depth_offered[dep] = depth_offered.get(dep, 0) + 1
            for dep in tested_depths:
                depth_tested[dep] = depth_tested.get(dep, 0) + 1
            for dep in range(1, r.accepted + 1):
                depth_reached[dep] = depth_reached.get(dep, 0) + 1
    by_depth = []
    for dep in sorted(depth_offered):
        reached, tested = depth_reached.get(dep, 0), depth_tested.get(dep, 0)
        by_depth.append({"depth": dep, "rounds": depth_offered[dep], "tested": tested, "accepted": reached,
                         "rate": round(reached / depth_offered[dep], 4),
                         "conditional_rate": round(reached / tested, 4) if tested else None})
    calibration = []
    for b, (tested, acc, csum) in enumerate(buckets):
        calibration.append({"lo": CONF_EDGES[b], "hi": CONF_EDGES[b + 1], "nodes": tested, "accepted": acc,
                            "mean_confidence": round(csum / tested, 4) if tested else None,
                            "observed_rate": round(acc / tested, 4) if tested else None})
    verifications = n_rounds
    summary = {
        "requests": len(per_request),
        "new_tokens": n_tokens,
        "rounds": n_rounds,
        "drafted": n_drafted,
        "accepted": n_accepted,
        "tau": round(1 + n_accepted / verifications, 4) if verifications else 0.0,  # GenerationResult.tau
        "mean_acceptance_length": round(sum(accept_lens) / len(accept_lens), 4) if accept_lens else 0.0,
        "seconds": round(total_s, 4),
        "tokens_per_second": round(n_tokens / total_s, 2) if total_s > 0 else 0.0,
        "acceptance_length_hist": _hist(accept_lens),
        "acceptance_by_depth": by_depth,
        "calibration": calibration,
        "time_split": {k: round(v, 6) for k, v in times.items()},
        "tree_nodes": {**nodes, "per_round_verified": round(nodes["verified"] / n_rounds, 3) if n_rounds else 0.0},
        "kv_bytes": {**kv, "target_row_bytes": target_row, "draft_row_bytes": draft_row},
        "per_request": per_request,
    }
    if experts is not None:
        summary["moe_experts"] = {"per_verification": list(experts),
                                  "mean": round(sum(experts) / len(experts), 3) if experts else 0.0,
                                  "max": max(experts) if experts else 0}
    return summary


# -- mixture-of-experts router hooks ------------------------------------------------------------
class ExpertTracker:
    """Counts the distinct experts each forward of a MoE model routes tokens to (summed over layers).

    Hooks every MoE block's router (`block.gate` of a module that also has `experts`): newer
    transformers routers return (logits, scores, indices); older ones return logits (top-k taken
    with the block's / config's k). `per_forward[i]` = distinct (layer, expert) pairs of forward i.
    """

    def __init__(self, model: nn.Module):
        self.per_forward: list[int] = []
        self._current: set[tuple[int, int]] | None = None
        self._hooks = []
        c = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        default_k = getattr(c, "num_experts_per_tok", None) or 2
        layer = 0
        for module in model.modules():
            gate = getattr(module, "gate", None)
            if gate is None or getattr(module, "experts", None) is None or not isinstance(gate, nn.Module):
                continue
            k = getattr(gate, "top_k", None) or getattr(module, "top_k", None) or default_k
            self._hooks.append(gate.register_forward_hook(self._hook(layer, int(k))))
            layer += 1
        self.num_moe_layers = layer
        if layer:
            self._hooks.append(model.register_forward_pre_hook(self._start))

    @property
    def active(self) -> bool:
        return self.num_moe_layers > 0

    def _start(self, *_args) -> None:
        if self._current is not None:
            self.per_forward.append(len(self._current))
        self._current = set()

    def _hook(self, layer: int, k: int):
        def hook(_module, _args, output):
            if self._current is None:
                return
            if isinstance(output, tuple) and not output[-1].is_floating_point():
                idx = output[-1]
            else:
                logits = output[0] if isinstance(output, tuple) else output
                idx = logits.topk(k, dim=-1).indices
            for e in idx.reshape(-1).unique().tolist():
                self._current.add((layer, int(e)))
        return hook

    def finish(self) -> list[int]:
        """Close the current forward; returns per_forward."""
        if self._current is not None:
            self.per_forward.append(len(self._current))
            self._current = None
        return self.per_forward

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []


# -- rendering ----------------------------------------------------------------------------------
def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def format_report(summary: dict) -> str:
    """A plain-text table of the summary (what `eaglespec report` prints)."""
    s = summary
    lines = [f"requests {s['requests']} | new tokens {s['new_tokens']} | rounds {s['rounds']} | tau {s['tau']:.3f} | "
             f"accepted {s['accepted']}/{s['drafted']} drafts | {s['tokens_per_second']} tok/s"]
    lines.append("")
    lines.append("acceptance length (tokens per verification): " + ", ".join(
        f"{k}: {v}" for k, v in s["acceptance_length_hist"].items()))
    lines.append("")
    lines.append(f"{'depth':>5} {'rounds':>7} {'tested':>7} {'accepted':>8} {'rate':>6} {'cond.':>6}")
    for row in s["acceptance_by_depth"]:
        cond = "-" if row["conditional_rate"] is None else f"{row['conditional_rate']:.3f}"
        lines.append(f"{row['depth']:>5} {row['rounds']:>7} {row['tested']:>7} {row['accepted']:>8} "
                     f"{row['rate']:>6.3f} {cond:>6}")
    lines.append("")
    lines.append(f"{'draft confidence':>16} {'nodes':>7} {'mean conf':>9} {'accepted':>8}")
    any_conf = False
    for b in s["calibration"]:
        if not b["nodes"]:
            continue
        any_conf = True
        lines.append(f"{b['lo']:>7.1f} - {b['hi']:<6.1f} {b['nodes']:>7} {b['mean_confidence']:>9.3f} "
                     f"{b['observed_rate']:>8.3f}")
    if not any_conf:
        lines.append("  (no draft confidences recorded: plain decoding or a proposer without logq)")
    lines.append("")
    t = s["time_split"]
    total = sum(t.values()) or 1.0
    lines.append("time: " + " | ".join(f"{k} {v:.3f}s ({100 * v / total:.0f}%)" for k, v in t.items()))
    n = s["tree_nodes"]
    lines.append(f"tree nodes: expanded {n['expanded']} | kept {n['kept']} | verified {n['verified']} "
                 f"({n['per_round_verified']} per round)")
    kv = s["kv_bytes"]
    lines.append(f"temporary KV per round (max): target {_fmt_bytes(kv['target_temp_bytes_max'])} | "
                 f"draft {_fmt_bytes(kv['draft_temp_bytes_max'])}")
    if "moe_experts" in s:
        m = s["moe_experts"]
        lines.append(f"MoE: distinct experts touched per verification: mean {m['mean']} | max {m['max']}")
    return "\n".join(lines)


def plot_report(summary: dict, path: str | Path) -> Path:
    """Render the summary as one PNG: 2x3 panels (histogram, depth, calibration, time, nodes, KV/MoE)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    s = summary
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    fig.suptitle(f"eaglespec: {s['requests']} request(s), {s['new_tokens']} tokens, tau {s['tau']:.2f}, "
                 f"{s['accepted']}/{s['drafted']} drafts accepted", fontsize=13)

    ax = axes[0, 0]
    hist = s["acceptance_length_hist"]
    xs = [int(k) for k in hist]
    ax.bar(xs, [hist[k] for k in hist], color="#3b75af")
    ax.set_title("acceptance length per verification")
    ax.set_xlabel("tokens emitted (accepted drafts + bonus)")
    ax.set_ylabel("rounds")
    if xs:
        ax.set_xticks(range(min(xs), max(xs) + 1))

    ax = axes[0, 1]
    rows = s["acceptance_by_depth"]
    deps = [r["depth"] for r in rows]
    ax.plot(deps, [r["rate"] for r in rows], "o-", label="reached (of rounds drafting it)")
    ax.plot(deps, [r["conditional_rate"] if r["conditional_rate"] is not None else math.nan for r in rows],
            "s--", label="given parent accepted")
    ax.set_ylim(-0.02, 1.02)
    if deps:
        ax.set_xticks(deps)
    ax.set_title("acceptance rate by tree depth")
    ax.set_xlabel("depth")
    ax.set_ylabel("rate")
    ax.legend(fontsize=8)

    ax = axes[0, 2]
    cal = [b for b in s["calibration"] if b["nodes"]]
    ax.plot([0, 1], [0, 1], ":", color="gray", label="perfect calibration")
    if cal:
        ax.scatter([b["mean_confidence"] for b in cal], [b["observed_rate"] for b in cal],
                   s=[20 + 200 * b["nodes"] / max(c["nodes"] for c in cal) for b in cal], color="#c44e52",
                   label="buckets (size = nodes)")
    else:
        ax.text(0.5, 0.5, "no confidences recorded", ha="center", va="center")
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("draft confidence vs observed acceptance")
    ax.set_xlabel("draft confidence q(token | parent)")
    ax.set_ylabel("accepted fraction of tested nodes")
    ax.legend(fontsize=8, loc="upper left")

    ax = axes[1, 0]
    t = s["time_split"]
    total = sum(max(v, 0.0) for v in t.values()) or 1.0
    names = list(t)
    ax.barh(names, [t[k] for k in names], color=["#55a868", "#3b75af", "#dd8452", "#b0b0b0"])
    for i, k in enumerate(names):
        ax.text(t[k], i, f" {t[k]:.3f}s ({100 * t[k] / total:.0f}%)", va="center", fontsize=9)
    ax.invert_yaxis()
    ax.set_xlim(0, max(t.values(), default=0) * 1.45 or 1)
    ax.set_xlabel("seconds")
    ax.set_title("time split")

    ax = axes[1, 1]
    n = s["tree_nodes"]
    ax.bar(["expanded", "kept", "verified", "accepted"], [n["expanded"], n["kept"], n["verified"], s["accepted"]],
           color=["#8172b2", "#64b5cd", "#3b75af", "#55a868"])
    ax.set_title(f"tree nodes (total; {n['per_round_verified']} verified per round)")

    ax = axes[1, 2]
    kv = s["kv_bytes"]
    labels = ["target temp KV\n(max/round)", "draft temp KV\n(max/round)"]
    vals = [kv["target_temp_bytes_max"] / 1024, kv["draft_temp_bytes_max"] / 1024]
    ax.bar(labels, vals, color=["#3b75af", "#dd8452"])
    ax.set_ylabel("KiB")
    title = "temporary KV per round"
    if "moe_experts" in s:
        ax2 = ax.twinx()
        ax2.bar(["MoE experts\n(mean/verify)"], [s["moe_experts"]["mean"]], color="#c44e52")
        ax2.set_ylabel("distinct experts")
        title += " / MoE experts"
    ax.set_title(title)

    fig.tight_layout(rect=(0, 0, 1, 0.95))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


# -- a run over prompts (what `eaglespec report` renders) ---------------------------------------
def run_report(es, prompts: Sequence, max_new_tokens: int, raw: bool = False, progress: bool = False,
               **sampling) -> dict:
    """Generate for every prompt with `es` (an EagleSpec) and summarize, MoE experts included (`progress`: a
    progress bar on stderr)."""
    from tqdm import tqdm

    tracker = ExpertTracker(es.model)
    results, experts = [], []
    try:
        for prompt in tqdm(prompts, desc="report", unit="prompt", disable=not progress, file=None):
            tracker.per_forward = []
            out = es.generate(prompt, max_new_tokens, raw=raw, **sampling)
            results.append(out.result)
            experts += tracker.finish()[1:]  # forward 0 is the prefill
    finally:
        tracker.remove()
    return summarize(results, es.model, es.drafter, experts if tracker.active else None)
