"""Does inference-time acceptance match what training measured? A train/inference consistency check.

    .venv/bin/python bench/tau_check.py [--data .gpu/trainset/regen.jsonl] [--draft DIR] [--limit 30]
        [--k 5] [--ttt-steps 7] [--max-new-tokens 384] [--mtbench N] [--full-eval] [--json OUT]

On the drafter's own held-out conversations (the trainer's split: `tokenize_all` + `split_eval(0.02,
seed 0)`, exactly as `eaglespec train` builds them; `--limit` of them, evenly spaced, since the data
file is sorted by prompt length), with the target in fp32 on CPU:

  ttt     the trainer's own eval path (Trainer.evaluate): top-1 by training-time-test step s against
          the target's argmax, data tokens fed at every step.
  tf      inference-side, teacher-forced: ONE forward of the engine's target backend over prompt +
          answer, then a Proposer driven as the engine drives it (one catch-up row per anchor t, so
          the drafter's KV holds rows 0..t), and the chain from that row fed the DATA tokens
          x_{t+1+s} with the drafter's own state (positions t+s), scored on the trainer's supervised
          rows and labels: must equal `ttt` step by step (same rows, same labels).
  chain   the same Proposer's real greedy chains (Proposer.propose: drafted tokens fed) from every
          anchor: a depth-d token is "accepted" when it and its ancestors equal the data tokens and
          the data equal the target's argmax. Conditional acceptance by depth, and `sim_tau`: the
          engine's tau replayed over the anchors a greedy run would visit (k = --k).
  engine  SpeculativeEngine greedy chain k=--k on the held-out prompts: tau and acceptance by depth
          (metrics.summarize). Its output is the fp32 target's own greedy answer; the three analyses
          above are repeated on it (set `fp32_greedy`), where `chain.sim_tau` must equal the engine's tau.

`--mtbench N` adds the first N MT-bench questions (engine + analyses on the engine's answers), the
distribution-shift number. `--full-eval` also runs the trainer's eval over the whole held-out split
(the model card's numbers). Everything runs in fp32 on CPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]

from eaglespec.api import DEFAULT_DRAFT, EagleSpec  # noqa: E402
from eaglespec.cli.bench import environment, load_prompts
from eaglespec.checkpoint.drafter import load_drafter  # noqa: E402
from eaglespec.draft.proposer import Proposer, shifted_tokens  # noqa: E402
from eaglespec.telemetry import summarize
from eaglespec.backends.loading import load_target
from eaglespec.train.data import Sample, read_conversations, split_eval, tokenize_all  # noqa: E402
from eaglespec.train.trainer import Prepared, TrainConfig, Trainer, attach_target  # noqa: E402
from eaglespec.tree.core import TreeSpec


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def held_out(tok, data: str, max_length: int, fraction: float, seed: int
             ) -> tuple[list[Sample], list[Sample], dict[int, dict]]:
    """(train, eval) samples exactly as `eaglespec train` splits them (command.cmd_train + trainer.train),
    and each eval sample's conversation by id(sample) (when tokenizing dropped none, else empty)."""
    convs = read_conversations(data)
    samples = tokenize_all(tok, convs, max_length)
    train_s, eval_s = split_eval(samples, fraction, seed)
    conv_of = {id(s): c for s, c in zip(samples, convs)} if len(samples) == len(convs) else {}
    return train_s, eval_s, conv_of


def spaced(items: list, n: int) -> list:
    """n items evenly spaced over the list (all of them when n >= len)."""
    if n >= len(items):
        return list(items)
    return [items[round(i * (len(items) - 1) / max(n - 1, 1))] for i in range(n)]


def answer_start(sample: Sample) -> int:
    """Index of the first assistant (loss-masked) token: the prompt is ids[:start]."""
    return int(sample.loss_mask.nonzero()[0, 0])


def ttt_eval(trainer: Trainer, samples: list[Sample]) -> dict:
    """The trainer's eval path (Trainer.evaluate) over `samples`, in chunks of cfg.batch_size samples:
    evaluate() runs every pack it is given in one batch, too much memory on CPU for more than a few
    conversations; its statistics are per-row sums, so the chunks recombine exactly (row-weighted)."""
    bs = trainer.cfg.batch_size
    steps = trainer.steps_per_row
    rows, acc, recall = torch.zeros(steps), torch.zeros(steps), torch.zeros(steps)
    for i in range(0, len(samples), bs):
        ev = trainer.evaluate([samples[i:i + bs]])
        n = torch.tensor(ev["rows_by_step"])
        rows += n
        acc += torch.tensor(ev["acc_by_step"]) * n
        recall += torch.tensor(ev["top10_recall_by_step"]) * n
    return {"acc_by_step": [round(float(a), 4) for a in acc / rows.clamp(min=1)],
            "rows_by_step": [int(r) for r in rows],
            "top10_recall_by_step": [round(float(a), 4) for a in recall / rows.clamp(min=1)]}


@torch.no_grad()
def anchor_chains(target, drafter, ids: torch.Tensor, first: int, steps: int) -> tuple[torch.Tensor, ...]:
    """Drafter chains from every anchor t = first .. n-2 of `ids` [n], as the engine drives the Proposer.

    Returns (truth [n]: the target's argmax after each row, tf [steps, n-1] draft ids of the
    teacher-forced chain (data tokens fed), chain [steps, n-1] target ids of Proposer.propose's
    chain (drafted tokens fed)); -1 where not computed.
    """
    n = ids.numel()
    target.reset()
    out = target.forward(ids)  # [n, V], [n, F]: features f_t of every row
    truth, feats = out.logits.argmax(-1), out.features
    tf = torch.full((steps, n - 1), -1, dtype=torch.long)
    chain = torch.full((steps, n - 1), -1, dtype=torch.long)
    forced = Proposer(drafter, TreeSpec("chain", depth=steps))  # catch_up + chain fed the data tokens
    engine = Proposer(drafter, TreeSpec("chain", depth=steps))  # propose(): the engine's own chain
    if first > 0:
        for p in (forced, engine):
            p.catch_up(feats[:first], shifted_tokens(ids, 0, first))
    for t in range(first, n - 1):
        tree = engine.propose(ids[t + 1], feats[t:t + 1], shifted_tokens(ids, t, 1))
        chain[:, t] = tree.tokens[1:]
        logits, state = forced.catch_up(feats[t:t + 1], shifted_tokens(ids, t, 1))
        tf[0, t] = logits.argmax(-1)
        for s in range(1, min(steps, n - 1 - t)):  # step s: row t+s fed x_{t+1+s}, as Proposer._chain
            pos = torch.tensor([forced.committed + s - 1])
            logits, states = forced.runner.run(state[None], ids[t + 1 + s:t + 2 + s], pos)
            tf[s, t], state = logits[0].argmax(-1), states[0]
        forced.runner.crop(forced.committed)
    return truth, tf, chain


def accepted_lengths(ids: torch.Tensor, truth: torch.Tensor, chain: torch.Tensor) -> torch.Tensor:
    """[steps, n-1] bool ok[d-1, t]: depth-d token from anchor t and its ancestors are all accepted, i.e.
    equal to the data tokens x_{t+1+j}, which equal the target's argmax truth[t+j] (j = 1..d)."""
    steps, m = chain.shape
    n = ids.numel()
    ok = torch.zeros(steps, m, dtype=torch.bool)
    t = torch.arange(m)
    for d in range(1, steps + 1):
        inside = t + 1 + d < n
        p = (t + 1 + d).clamp(max=n - 1)
        good = inside & (chain[d - 1] == ids[p]) & (ids[p] == truth[(t + d).clamp(max=n - 1)])
        ok[d - 1] = good & (ok[d - 2] if d > 1 else True)
    return ok


def simulate_rounds(ok: torch.Tensor, start: int, n: int, k: int) -> list[int]:
    """Replay greedy chain rounds over an answer ids[start:n] whose every token is the target's greedy
    choice: the draft tokens accepted in each round (ok[:k, anchor].sum()), visiting only the anchors a
    run visits (the root of each round is the last token emitted)."""
    emitted, accepted = 1, []  # the prefill emits ids[start]
    total = n - start
    while emitted < total:
        anchor = start + emitted - 2  # the root ids[anchor + 1] is the last emitted token
        accepted.append(int(ok[:k, anchor].sum()))
        emitted = min(total, emitted + accepted[-1] + 1)
    return accepted


def by_depth(lengths: list[int] | torch.Tensor, k: int) -> list[float]:
    """Conditional acceptance at depths 1..k from accepted lengths (depth d given d-1 accepted)."""
    lengths = torch.as_tensor(lengths)
    reach = [int((lengths >= d).sum()) for d in range(k + 1)]
    return [round(reach[d] / reach[d - 1], 4) if reach[d - 1] else 0.0 for d in range(1, k + 1)]


def analyse(trainer: Trainer, target, drafter, samples: list[Sample], steps: int, k: int, chains: bool = True) -> dict:
    """ttt (trainer eval) vs tf (teacher-forced Proposer) vs chain (Proposer chains) on `samples`."""
    ttt = ttt_eval(trainer, samples)
    if not chains:
        return {"conversations": len(samples), "ttt": ttt}
    correct = torch.zeros(steps)
    rows = torch.zeros(steps)
    label_vs_truth = chain_vs_tf = chain_checked = data_vs_truth = data_n = 0
    every: list[torch.Tensor] = []  # accepted length (<= steps) of the chain from every answer anchor
    rounds: list[int] = []  # accepted per round of the replayed greedy run (k)
    emitted = 0
    per_sample = []
    t0 = time.perf_counter()
    for i, smp in enumerate(samples):
        prep: Prepared = trainer.prepare_many([[smp]])[0]
        a, n = answer_start(smp), smp.ids.numel()
        truth, tf, chain = anchor_chains(target, drafter, smp.ids, max(0, a - steps), steps)
        ok = accepted_lengths(smp.ids, truth, chain)
        src = prep.plan.src  # single-sample pack: row m has anchor t = src[m] (= m)
        hits = torch.zeros(steps)
        for s in range(steps):
            m = prep.sup[s].nonzero()[:, 0]
            label = prep.argmax[prep.label_row[s, m]]  # draft ids
            t = src[m]
            hits[s] = (tf[s, t] == label).sum()
            rows[s] += m.numel()
            label_vs_truth += int((drafter.to_target_ids(label) != truth[t + 1 + s]).sum())
            if s:  # the chain's context equals the teacher-forced one where its ancestors hit the data
                same = (chain[:s, t] == smp.ids[t[None] + 1 + torch.arange(1, s + 1)[:, None]]).all(0)
                chain_checked += int(same.sum())
                chain_vs_tf += int((drafter.to_target_ids(tf[s, t[same]]) != chain[s, t[same]]).sum())
        correct += hits
        every.append(ok[:, a - 1:n - 1].sum(0))  # anchors a-1..n-2: roots ids[a..n-1], every answer token
        data_vs_truth += int((smp.ids[a:] == truth[a - 1:n - 1]).sum())
        data_n += n - a
        acc = simulate_rounds(ok, a, n, k)
        rounds += acc
        emitted += n - a - 1
        per_sample.append({"tokens": n, "answer": n - a, "tf_acc0": round(float(hits[0] / max(1, prep.sup[0].sum())), 4),
                           "sim_tau": round((n - a - 1) / len(acc), 4) if acc else 0.0})
        if (i + 1) % 5 == 0:
            log(f"  analysed {i + 1}/{len(samples)} ({time.perf_counter() - t0:.0f} s)")
    every_t = torch.cat(every)
    return {
        "conversations": len(samples),
        "ttt": ttt,
        "tf": {"acc_by_step": [round(float(c / max(r, 1)), 4) for c, r in zip(correct, rows)],
               "rows_by_step": [int(r) for r in rows],
               "labels_not_target_argmax": label_vs_truth,
               "chain_rows_checked": chain_checked, "chain_differs_from_tf": chain_vs_tf},
        "chain": {"k": k, "anchors": every_t.numel(),
                  # every answer position as a round's root: what per-token (training) metrics weigh
                  "every_anchor_reach_by_depth": [round(float((every_t >= d).float().mean()), 4)
                                                  for d in range(1, steps + 1)],
                  "every_anchor_conditional_by_depth": by_depth(every_t, steps),
                  "every_anchor_tau": round(1 + float(every_t.clamp(max=k).float().mean()), 4),
                  # the anchors a greedy run visits (rounds concentrate where drafting fails)
                  "rounds": len(rounds), "round_conditional_by_depth": by_depth(rounds, k),
                  "sim_tau": round(emitted / len(rounds), 4) if rounds else 0.0},
        "data_is_target_argmax": round(data_vs_truth / max(data_n, 1), 4),
        "per_sample": per_sample,
    }


def run_engine(es: EagleSpec, prompts: list[list[int]], max_new: int) -> tuple[dict, list[list[int]]]:
    """Greedy chain generation; (summary, generated token ids per prompt)."""
    results = []
    t0 = time.perf_counter()
    for i, ids in enumerate(prompts):
        results.append(es.engine.generate(ids, max_new, es.eos_ids()))
        log(f"  engine {i + 1}/{len(prompts)}: {len(results[-1].token_ids)} tokens, tau {results[-1].tau:.3f} "
            f"({time.perf_counter() - t0:.0f} s)")
    s = summarize(results)
    keep = ("tau", "rounds", "drafted", "accepted", "new_tokens", "mean_acceptance_length", "acceptance_length_hist")
    out = {k: s[k] for k in keep}
    out["acceptance_by_depth"] = [{k: r[k] for k in ("depth", "tested", "accepted", "conditional_rate")}
                                  for r in s["acceptance_by_depth"]]
    out["mean_tau_per_prompt"] = round(sum(r.tau for r in results) / len(results), 4)
    return out, [r.token_ids for r in results]


def greedy_samples(prompts: list[list[int]], answers: list[list[int]]) -> list[Sample]:
    """prompt + the engine's (= the fp32 target's greedy) answer, loss on the answer."""
    out = []
    for p, a in zip(prompts, answers):
        ids = torch.tensor(p + a, dtype=torch.long)
        mask = torch.zeros(ids.numel(), dtype=torch.bool)
        mask[len(p):] = True
        out.append(Sample(ids, mask))
    return out


def common_prefix(a: list[int], b: list[int]) -> int:
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    return i


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=str(ROOT / ".gpu/trainset/regen.jsonl"), help="the drafter's training data")
    ap.add_argument("--draft", default=str(DEFAULT_DRAFT))
    ap.add_argument("--limit", type=int, default=30, help="held-out conversations used (evenly spaced)")
    ap.add_argument("--k", type=int, default=5, help="engine chain length")
    ap.add_argument("--ttt-steps", type=int, default=7)
    ap.add_argument("--max-new-tokens", type=int, default=384,
                    help="engine answers (the regeneration's cap); held-out answers are cut there too")
    ap.add_argument("--max-length", type=int, default=2048, help="as the drafter was trained (--max-length)")
    ap.add_argument("--eval-fraction", type=float, default=0.02)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-batch", type=int, default=4,
                    help="conversations per trainer-eval micro-batch (training used 64: too much memory on CPU)")
    ap.add_argument("--mtbench", type=int, default=0, help="also the first N MT-bench questions")
    ap.add_argument("--full-eval", action="store_true", help="trainer eval over the whole held-out split too")
    ap.add_argument("--no-engine", action="store_true", help="skip generation (and the fp32-greedy set)")
    ap.add_argument("--no-chains", action="store_true", help="trainer eval only (no Proposer analysis)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="bfloat16: target and inference drafter in bf16 (the GPU engine's setting); the trainer "
                         "eval then uses an fp32 drafter under bf16 autocast, as training did")
    ap.add_argument("--backend", default="hf", choices=["hf", "fast"], help="the engine's target backend")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None, help="write the report here")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    model, tok = load_target(None, device="cpu", dtype=args.dtype)
    c = model.config

    def drafter_in(dtype: torch.dtype) -> torch.nn.Module:
        d = load_drafter(args.draft, target_num_layers=c.num_hidden_layers, target_hidden_size=c.hidden_size,
                         target_vocab_size=model.get_output_embeddings().weight.shape[0], dtype=torch.float32)
        return attach_target(d.to(dtype=dtype).eval(), model)

    bf16 = args.dtype == "bfloat16"
    drafter = drafter_in(model.dtype)  # inference: the drafter in the target's dtype, as EagleSpec loads it
    steps, k = args.ttt_steps, args.k
    es = EagleSpec(model, tok, drafter, TreeSpec("chain", depth=k), backend=args.backend)  # engine + its target
    cfg = TrainConfig(method="eagle3", device="cpu", autocast=bf16, ttt_steps=steps, batch_size=args.eval_batch,
                      max_length=args.max_length, progress=False)
    trainer = Trainer(model, drafter_in(torch.float32) if bf16 else drafter, cfg, tok)  # bf16: fp32 + autocast

    train_s, eval_s, conv_of = held_out(tok, args.data, args.max_length, args.eval_fraction, args.seed)
    # answers cut at --max-new-tokens: the regenerated and the engine's answers cover the same positions
    picked = spaced(eval_s, args.limit)
    chosen = [Sample(s.ids[:answer_start(s) + args.max_new_tokens], s.loss_mask[:answer_start(s) + args.max_new_tokens])
              for s in picked]
    prompts = [s.ids[:answer_start(s)].tolist() for s in chosen]
    # chat template: the engine's own encoding of the conversation up to the answer is the training prompt
    template_differs = None if not conv_of else sum(
        es.encode(conv_of[id(s)]["messages"][:1]) != p for s, p in zip(picked, prompts))
    train_answers = {tuple(s.ids[s.loss_mask].tolist()) for s in train_s}
    dup = [tuple(s.ids[s.loss_mask].tolist()) in train_answers for s in picked]
    log(f"held out {len(eval_s)} of {len(train_s) + len(eval_s)} conversations; using {len(chosen)} "
        f"({sum(dup)} with an answer identical to a training answer)")
    report: dict = {"environment": environment(torch.device("cpu")) | {"threads": torch.get_num_threads(),
                                                                       "machine": platform.machine()},
                    "config": {k2: v for k2, v in vars(args).items() if k2 != "json"},
                    "heldout": {"split": len(eval_s), "used": len(chosen),
                                "answer_in_train": sum(dup), "engine_prompt_differs": template_differs,
                                "answer_in_train_split": sum(tuple(s.ids[s.loss_mask].tolist()) in train_answers
                                                             for s in eval_s)}}
    if args.full_eval:
        log("trainer eval over the whole held-out split ...")
        report["ttt_full_split"] = ttt_eval(trainer, eval_s)
        log(f"  {report['ttt_full_split']['acc_by_step']}")

    log("regen answers: ttt vs teacher-forced Proposer vs chains ...")
    report["regen"] = analyse(trainer, es.target, drafter, chosen, steps, k, not args.no_chains)
    fresh = [s for s, d in zip(chosen, dup) if not d]
    if len(fresh) < len(chosen):
        report["regen"]["ttt_without_train_duplicates"] = ttt_eval(trainer, fresh)
    log(json.dumps({key: v for key, v in report["regen"].items() if key in ("ttt", "tf", "chain")}))

    if not args.no_engine:
        log("engine (greedy chain) on the held-out prompts ...")
        report["engine"], answers = run_engine(es, prompts, args.max_new_tokens)
        regen = [s.ids[answer_start(s):].tolist() for s in chosen]
        report["engine"]["answers_equal_regen"] = sum(
            common_prefix(a, r) >= min(len(a), len(r) - 2) for a, r in zip(answers, regen))  # regen ends <|im_end|>\n
        report["engine"]["mean_common_prefix_with_regen"] = round(
            sum(common_prefix(a, r) for a, r in zip(answers, regen)) / len(answers), 1)
        log(json.dumps(report["engine"]))
        log("fp32 greedy answers: ttt vs teacher-forced Proposer vs chains ...")
        report["fp32_greedy"] = analyse(trainer, es.target, drafter, greedy_samples(prompts, answers), steps, k,
                                       not args.no_chains)
        log(json.dumps({key: v for key, v in report["fp32_greedy"].items() if key in ("ttt", "tf", "chain")}))
    if args.mtbench:
        prompts = [es.encode(p) for p in load_prompts("mtbench", args.mtbench)]
        log(f"MT-bench, {len(prompts)} questions: engine ...")
        report["mtbench_engine"], answers = run_engine(es, prompts, args.max_new_tokens)
        report["mtbench_fp32_greedy"] = analyse(trainer, es.target, drafter, greedy_samples(prompts, answers),
                                                steps, k, not args.no_chains)
        log(json.dumps({key: v for key, v in report["mtbench_fp32_greedy"].items() if key in ("ttt", "tf", "chain")}))
    report["seconds"] = round(time.perf_counter() - t_start, 1)
    text = json.dumps(report, indent=1)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
