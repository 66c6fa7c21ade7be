"""Acceptance at T=1 by depth, measured against what the drafter's distribution allows; the sibling curve.

    python bench/t1_acceptance.py [--limit 6] [--k 4] [--max-new-tokens 96] [--seed 0] [--seeds 1]
        [--no-dynamic] [--draft DIR] [--siblings 6] [--json OUT]

The default pair (or --draft) in fp32 on CPU, one thread, on the first --limit MT-bench first turns:

  engine   SpeculativeEngine, chain k=--k at T=1 (sampled drafts x ~ q, verified with the real q:
           min(1, p/q)), fixed seeds: per-round accepted drafts. Also greedy (T=0) and, unless --no-dynamic,
           a dynamic tree at T=1 (children drawn from q).
  theory   teacher-forced on each run's own emitted text: ONE target forward (p = process_logits(logits, T=1),
           the engine's p) and the drafter as the Proposer runs it (catch-up rows over the verified prefix,
           then chain rows fed the text's tokens with the drafter's own states), q = process_logits(draft
           logits, T=1) mapped through d2t. At every (anchor, depth): beta = sum_x min(p(x), q(x)) (the
           acceptance rate of a draft x ~ q under speculative sampling), p(argmax q) (a point-mass draft of
           the argmax), sum of p over q's top-6 (point mass with 6 siblings), argmax agreement (T=0), H(p),
           the mass of p outside the draft vocabulary (an upper bound on any acceptance), and beta for q at
           other draft temperatures (q ~ softmax(logits / T')): a diagnostic of q's calibration.
  siblings rrs1_mc .. rrsN_mc at depth 1 (eaglespec.tree.sampled_fit.sibling_acceptance): the acceptance with
           j = 1..--siblings children drawn without replacement; bench/fit_sampled_tree.py fits a tree to it.

Exact comparison (no approximation): in a round whose first d-1 drafts were accepted, those drafts ARE the
emitted tokens, so the teacher-forced q_d and p at that round's anchor are exactly the engine's, and P(accept
depth d | history) = beta_d there. Hence the measured conditional rate at depth d must match the mean of
beta_d over the rounds that reached depth d (up to sampling noise, a standard error is reported). The engine's
recorded q (round detail draft_probs) is also compared with the teacher-forced q on those rows.

Losslessness checks on the real pair: the token emitted right after each round's root is y ~ p, so
E[p(y)] = E[sum p^2]; and the chain's test decomposed at every tested depth from the engine's recorded draft:
the draw (E[q(x)] = E[sum q^2]), the coin (P(accept | x) = min(1, p(x)/q(x))) and the correction token
(y ~ norm(max(0, p - q))). Each reports a z score of the mean difference.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

from eaglespec.api import EagleSpec
from eaglespec.datasets import load_prompts
from eaglespec.engine.loop import GenerationResult, SpeculativeEngine
from eaglespec.sampling import SamplingConfig, SamplingParams, process_logits
from eaglespec.tree.core import TreeSpec
from eaglespec.tree.sampled_fit import sibling_acceptance

TOPN = 6  # point-mass siblings (the shipped dynamic tree's top-k)
DRAFT_TEMPS = (0.7, 0.85, 1.0, 1.2, 1.5)
SIBLINGS = 6  # depth-1 Monte Carlo of up to this many sampled siblings (without replacement) with the real q


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def rrs_names(siblings: int) -> list[str]:
    """rrs{j}_mc for j = 1..siblings: P(a depth-1 draft is accepted) with j sampled siblings."""
    return [f"rrs{j}_mc" for j in range(1, siblings + 1)]


@torch.no_grad()
def teacher_forced(es: EagleSpec, ids: torch.Tensor, k: int, start: int, gen: torch.Generator,
                   siblings: int = SIBLINGS) -> dict[str, torch.Tensor]:
    """Per (depth d = 1..k, catch-up row t) statistics of the drafter's q_d vs the target's p at row t + d.

    Row t of the catch-up pairs f_t with x_{t+1} and predicts x_{t+2} (q_1); the depth-j chain row of anchor t
    is fed x_{t+1+j} at position t + j (Proposer._chain / TreeRows) and predicts x_{t+2+j} (q_{j+1}). Returns
    tensors [k, n-1] (NaN where the text ends) and q [k, n-1, Vd] is NOT kept (memory): only the per-row
    numbers, plus `q1` [n-1, Vd] for the direct check against the engine's recorded q. Depth 1 also gets
    rrs{j}_mc for j = 1..siblings (sibling_acceptance) on the answer rows (catch-up rows >= start).
    """
    target, drafter = es.target, es.drafter
    n = ids.numel()
    target.reset()
    out = target.forward(ids)  # logits [n, V], features [n, F]
    p_all = process_logits(out.logits, SamplingParams(temperature=1.0))  # [n, V]
    target.reset()
    vd = drafter.d2t.numel()
    dv_ids = drafter.to_target_ids(torch.arange(vd))  # [Vd] target id of each draft id
    cache = drafter.new_cache()
    L = n - 1  # catch-up rows 0..n-2
    state = drafter.project(out.features[:L])
    logits, states = drafter(state, ids[1:n], torch.arange(L), cache)  # causal: = the engine's catch-up
    names = ["beta", "pm_top1", f"pm_top{TOPN}", "agree0", "H_p", "H_q", "p_outside", "p_top1"]
    names += [f"beta_T{t:g}" for t in DRAFT_TEMPS] + rrs_names(siblings)
    res = {name: torch.full((k, L), float("nan")) for name in names}
    offsets: list[int] = []  # cache offset of each depth's tree block
    col = torch.arange(L)
    q1 = None
    for d in range(1, k + 1):
        m = L - (d - 1)  # anchors t = 0..m-1 (x_{t+d} must exist: fed at depth d-1; p row t+d <= n-1)
        if d > 1:  # run the depth-(d-1) chain rows fed x_{t+d}
            j = d - 1
            length = cache[0].length
            vis = torch.zeros(m, length + m, dtype=torch.bool)
            vis[:, :L] = col[None, :] <= torch.arange(m)[:, None]
            for off in offsets:
                vis[torch.arange(m), off + torch.arange(m)] = True
            vis[torch.arange(m), length + torch.arange(m)] = True
            offsets.append(length)
            logits, states = drafter(states[:m], ids[1 + j: 1 + j + m], torch.arange(m) + j, cache, visible=vis)
        lq = logits[:m].float()  # [m, Vd]
        p = p_all[d: d + m]  # [m, V]: row t + d
        pd = p[:, dv_ids]  # [m, Vd]
        q = process_logits(lq, SamplingParams(temperature=1.0))
        if d == 1:
            q1 = q
            curve = sibling_acceptance(pd[start:], q[start:], siblings, gen)  # answer rows only (catch-up rows >= start)
            for j, name in enumerate(rrs_names(siblings)):
                res[name][0, start:m] = curve[:, j]
        res["beta"][d - 1, :m] = torch.minimum(pd, q).sum(-1)
        top = q.topk(TOPN, dim=-1).indices
        res["pm_top1"][d - 1, :m] = pd.gather(1, top[:, :1])[:, 0]
        res[f"pm_top{TOPN}"][d - 1, :m] = pd.gather(1, top).sum(-1)
        res["agree0"][d - 1, :m] = (dv_ids[top[:, 0]] == p.argmax(-1)).float()
        res["H_p"][d - 1, :m] = -(p * p.clamp_min(1e-30).log()).sum(-1)
        res["H_q"][d - 1, :m] = -(q * q.clamp_min(1e-30).log()).sum(-1)
        res["p_outside"][d - 1, :m] = 1 - pd.sum(-1)
        res["p_top1"][d - 1, :m] = p.max(-1).values
        for t in DRAFT_TEMPS:
            qt = process_logits(lq, SamplingParams(temperature=t))
            res[f"beta_T{t:g}"][d - 1, :m] = torch.minimum(pd, qt).sum(-1)
    res["q1"] = q1
    res["p_all"] = p_all
    return res


def anchors(prompt_len: int, result: GenerationResult) -> list[int]:
    """Catch-up row t = root index - 1 of every round (the root of round 0 is the prefill's token)."""
    out, root = [], prompt_len
    for r in result.rounds:
        out.append(root - 1)
        root += r.emitted
    return out


def mean(xs) -> float:
    xs = [float(x) for x in xs if not math.isnan(float(x))]
    return sum(xs) / len(xs) if xs else float("nan")


def chain_report(rows: list[tuple[int, dict, int]], k: int, predictor: str, siblings: int = SIBLINGS) -> dict:
    """rows: (accepted, tf stats at the round's anchor {name: [k]}, drafted). Measured vs predicted by depth:
    `predictor` = "beta" (T=1, speculative sampling) or "agree0" (T=0, greedy: exact)."""
    out = {"rounds": len(rows), "predictor": predictor, "by_depth": []}
    for d in range(1, k + 1):
        reach = [(acc, st) for acc, st, _ in rows if acc >= d - 1 and not math.isnan(st[predictor][d - 1])]
        hit = sum(acc >= d for acc, _ in reach)
        pred = [st[predictor][d - 1] for _, st in reach]
        var = sum(b * (1 - b) for b in pred)  # Bernoulli variance of the sum given the betas
        row = {"depth": d, "rounds_reaching": len(reach),
               "measured": round(hit / len(reach), 4) if reach else None,
               "predicted": round(mean(pred), 4),
               "se": round(math.sqrt(var) / len(reach), 4) if reach else None,
               "z": round((hit - sum(pred)) / math.sqrt(var), 2) if var > 0 else None}
        for name in ("beta", "pm_top1", f"pm_top{TOPN}", "agree0", "H_p", "p_outside", "beta_T0.85", "beta_T1.2",
                     *rrs_names(siblings)):
            row[name] = round(mean(st[name][d - 1] for _, st in reach), 4)
        out["by_depth"].append(row)
    return out


def summarize_positions(tf_list: list[dict], k: int) -> dict:
    """Means over every answer position (catch-up rows from prompt_len - 1 on), by depth."""
    out = {}
    names = [n for n in tf_list[0] if n not in ("q1", "p_all", "start")]
    for name in names:
        vals = []
        for d in range(k):
            xs = torch.cat([tf[name][d, tf["start"]:] for tf in tf_list])
            xs = xs[~xs.isnan()]
            vals.append(round(float(xs.mean()), 4) if xs.numel() else None)
        out[name] = vals
    return out


def no_nan(x):
    """NaN -> None, recursively (strict JSON)."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: no_nan(v) for k, v in x.items()}
    if isinstance(x, list):
        return [no_nan(v) for v in x]
    return x


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=6, help="MT-bench first turns (the first N)")
    ap.add_argument("--k", type=int, default=4, help="chain length")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=1, help="T=1 runs per prompt (seeds seed .. seed+N-1)")
    ap.add_argument("--siblings", type=int, default=SIBLINGS,
                    help="depth-1 Monte Carlo: the acceptance with 1..N sampled siblings (rrs1_mc .. rrsN_mc; "
                         "bench/fit_sampled_tree.py fits a sampled static tree to this curve)")
    ap.add_argument("--no-dynamic", action="store_true", help="skip the dynamic-tree run")
    ap.add_argument("--dynamic", default="5,6,24", help="dynamic tree depth,top_k,budget")
    ap.add_argument("--draft", default=None, help="a drafter directory (default: the shipped one)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.siblings < 1:
        ap.error(f"--siblings must be >= 1, got {args.siblings}")
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    k = args.k
    es = EagleSpec.from_pretrained(draft=args.draft, device="cpu", dtype="float32", spec=TreeSpec("chain", depth=k))
    log(f"{es.draft_note}; target backend {es.target.name}")
    prompts = [es.encode(p) for p in load_prompts("mtbench", args.limit)]
    eos = es.eos_ids()
    chain = es.engine
    dd, dk, db = (int(x) for x in args.dynamic.split(","))
    dyn = None if args.no_dynamic else SpeculativeEngine(es.target, es.drafter, TreeSpec("dynamic", depth=dd, top_k=dk,
                                                                                        budget=db))
    runs = {"chain_t1": [], "chain_t0": [], "dynamic_t1": []}
    tf_runs = {"chain_t1": [], "chain_t0": []}
    q_check = {"rows": 0, "max_abs_diff": 0.0, "max_abs_diff_H_q_any_depth": 0.0}
    dyn_rows = []  # (accepted >= 1, sum p over the root's children, number of root children)
    # losslessness check: the token emitted right after each round's root, y ~ p, so E[p(y)] = E[sum_x p(x)^2]
    first_tok = {"chain_t1": [], "dynamic_t1": []}  # (p(y), sum p^2)
    # the chain's T=1 test decomposed at every tested depth d, from the engine's recorded draft x_d and q_d:
    # draws (E[q(x)] = E[sum q^2]), coins (P(accept | x) = min(1, p(x)/q(x))), correction (y ~ norm(max(0, p - q)))
    parts = {d: {"draw": [], "coin": [], "fix": []} for d in range(1, k + 1)}
    tau = {name: [0, 0] for name in runs}
    mc_gen = torch.Generator().manual_seed(1234)  # emitted - 1, rounds
    for i, prompt in enumerate(prompts):
        P = len(prompt)
        t1s = [SamplingConfig(SamplingParams(temperature=1.0), seed=args.seed + j) for j in range(args.seeds)]
        for name, sampling in [("chain_t1", t1) for t1 in t1s] + [("chain_t0", None)]:
            res = chain.generate(prompt, args.max_new_tokens, eos, sampling=sampling)
            ids = torch.tensor(prompt + res.token_ids)
            tf = teacher_forced(es, ids, k, P - 1, mc_gen, args.siblings)
            tf["start"] = P - 1
            for r, t in zip(res.rounds, anchors(P, res)):
                st = {nm: tf[nm][:, t].tolist() for nm in tf if nm not in ("q1", "p_all", "start")}
                runs[name].append((r.accepted, st, r.drafted))
                if name == "chain_t1" and t + 2 < ids.numel():
                    pr = tf["p_all"][t + 1]
                    first_tok[name].append((float(pr[ids[t + 2]]), float((pr * pr).sum())))
                if name == "chain_t1":
                    dp, toks = r.detail["draft_probs"], r.detail["tokens"]
                    for d in range(1, min(r.accepted + 1, k) + 1):
                        if t + d >= ids.numel():
                            break
                        qv, pv, x = dp[d - 1], tf["p_all"][t + d], int(toks[d])
                        parts[d]["draw"].append((float(qv[x]), float((qv * qv).sum())))
                        parts[d]["coin"].append((float(r.accepted >= d), min(1.0, float(pv[x] / qv[x]))))
                        if r.accepted == d - 1 and t + 1 + d < ids.numel():
                            rest = (pv - qv).clamp_min(0)
                            rest = rest / rest.sum()
                            parts[d]["fix"].append((float(rest[ids[t + 1 + d]]), float((rest * rest).sum())))
                if name == "chain_t1":  # the engine's recorded q_1 vs the teacher-forced one
                    q_eng = r.detail["draft_probs"][0][es.drafter.to_target_ids(torch.arange(es.drafter.d2t.numel()))]
                    q_check["max_abs_diff"] = max(q_check["max_abs_diff"], float((q_eng - tf["q1"][t]).abs().max()))
                    q_check["rows"] += 1
                    dp = r.detail["draft_probs"]
                    for d in range(1, min(r.accepted + 1, k) + 1):  # engine q_d = tf q_d where d-1 drafts accepted
                        qe = dp[d - 1].clamp_min(1e-30)
                        h = float(-(dp[d - 1] * qe.log()).sum())
                        if not math.isnan(tf["H_q"][d - 1, t]):
                            q_check["max_abs_diff_H_q_any_depth"] = max(q_check["max_abs_diff_H_q_any_depth"],
                                                                        abs(h - float(tf["H_q"][d - 1, t])))
            tf_runs[name].append({nm: v for nm, v in tf.items() if nm not in ("q1", "p_all")})
            tau[name][0] += len(res.rounds) + sum(r.accepted for r in res.rounds)  # 1 + accepted per round
            tau[name][1] += len(res.rounds)
            log(f"prompt {i}: {name} {len(res.token_ids)} tokens, tau {res.tau:.3f} ({time.perf_counter() - t0:.0f} s)")
        for t1 in t1s if dyn is not None else []:
            res = dyn.generate(prompt, args.max_new_tokens, eos, sampling=t1)
            ids = torch.tensor(prompt + res.token_ids)
            es.target.reset()
            p_all = process_logits(es.target.forward(ids).logits, SamplingParams(temperature=1.0))
            es.target.reset()
            for r, t in zip(res.rounds, anchors(P, res)):
                par, toks = r.detail["parents"], r.detail["tokens"]
                kids = toks[par == 0]
                dyn_rows.append((r.accepted >= 1, float(p_all[t + 1, kids].sum()), int(kids.numel())))
                if t + 2 < ids.numel():
                    first_tok["dynamic_t1"].append((float(p_all[t + 1, ids[t + 2]]), float((p_all[t + 1] ** 2).sum())))
            tau["dynamic_t1"][0] += len(res.rounds) + sum(r.accepted for r in res.rounds)
            tau["dynamic_t1"][1] += len(res.rounds)
            log(f"prompt {i}: dynamic_t1 {len(res.token_ids)} tokens, tau {res.tau:.3f} "
                f"({time.perf_counter() - t0:.0f} s)")
    report: dict = {"config": vars(args) | {"threads": torch.get_num_threads(), "drafter": es.draft_note,
                                            "backend": es.target.name},
                    "tau": {n: round(e / r, 4) for n, (e, r) in tau.items() if r}}
    for name in ("chain_t1", "chain_t0"):
        report[name] = chain_report(runs[name], k, "beta" if name == "chain_t1" else "agree0", args.siblings)
        report[name]["all_positions"] = summarize_positions(tf_runs[name], k)
        b = report[name]["by_depth"]
        a = b[0]["predicted"]
        report[name]["geometric_tau_iid"] = round(sum(a ** d for d in range(k + 1)), 4)  # i.i.d. estimate
        report[name]["product_tau_rounds"] = round(1 + mean(  # E[1 + b1 + b1 b2 + ...] along the emitted text
            sum(math.prod(st["beta" if name == "chain_t1" else "agree0"][:d]) for d in range(1, k + 1))
            for _, st, _ in runs[name] if not any(math.isnan(x) for x in st["beta"])), 4)
        report[name]["measured_accepted_per_round"] = round(mean(acc for acc, _, _ in runs[name]), 4)
    report["chain_t1"]["engine_q_vs_teacher_forced_q1"] = q_check
    if dyn_rows:
        hit = sum(h for h, _, _ in dyn_rows)
        pred = [s for _, s, _ in dyn_rows]
        var = sum(s * (1 - s) for s in pred)
        report["dynamic_t1"] = {"rounds": len(dyn_rows), "depth1_measured": round(hit / len(dyn_rows), 4),
                                "depth1_predicted_sum_p_children": round(mean(pred), 4),
                                "se": round(math.sqrt(var) / len(dyn_rows), 4),
                                "mean_root_children": round(mean(c for _, _, c in dyn_rows), 2)}
    def paired(rows: list[tuple[float, float]]) -> dict:
        """measured vs expected means of (observed, expected) pairs, z of the mean difference."""
        if not rows:
            return {"n": 0}
        diff = [a - b for a, b in rows]
        m = sum(diff) / len(diff)
        sd = math.sqrt(sum((x - m) ** 2 for x in diff) / max(len(diff) - 1, 1))
        return {"n": len(rows), "observed": round(mean(a for a, _ in rows), 4),
                "expected": round(mean(b for _, b in rows), 4), "z": round(m / (sd / math.sqrt(len(rows))), 2) if sd else None}

    report["chain_t1"]["decomposed_by_depth"] = [
        {"depth": d, "draw_q_of_x_vs_sum_q2": paired(v["draw"]), "accept_vs_min_1_p_over_q": paired(v["coin"]),
         "correction_res_of_y_vs_sum_res2": paired(v["fix"])} for d, v in parts.items()]
    for name, rows in first_tok.items():
        if rows:
            diff = [a - b for a, b in rows]
            m = sum(diff) / len(diff)
            sd = math.sqrt(sum((x - m) ** 2 for x in diff) / max(len(diff) - 1, 1))
            report[name]["emitted_first_token_check"] = {
                "rounds": len(rows), "mean_p_of_emitted": round(mean(a for a, _ in rows), 4),
                "mean_sum_p_squared": round(mean(b for _, b in rows), 4), "z": round(m / (sd / math.sqrt(len(rows))), 2)}
    report["seconds"] = round(time.perf_counter() - t0, 1)
    text = json.dumps(no_nan(report), indent=1)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
