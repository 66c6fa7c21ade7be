"""Batched serving: aggregate tokens/s and per-request latency, plain batched vs speculative batched decoding.

    python bench/batch.py [--batches 1,4,16,64] [--limit 64] [--max-new-tokens 128] [--device cuda]
        [--dtype bfloat16] [--draft DIR] [--tree dynamic] [--batch-backend auto|fast|hf] [--json OUT]
    python bench/batch.py --serve [--requests 8] [--max-new-tokens 32]     # the HTTP server, CPU fp32

Engine mode: for each batch size B, the first --limit MT-bench first turns go to the batched engine (engine/
batch.py) with max_batch B: max(--waves x B, --per-batch) requests, the prompts in order and repeated when fewer,
all submitted at once (continuous batching: a request joins when a row frees), once without a drafter (plain batched
decoding), once with it, and once with it under the depth plan (adaptive: per batch size the chain length, or plain
steps, with the most expected tokens/s from round times measured when the engine is built; engine/plan.py). Every
timed run is the second of two (the first compiles the kernels for the shapes and lengths it meets). Reported per
(B, method): aggregate tokens/s, p50/p99 time to first token and time per output token (per request: (finish - first
token) / (tokens - 1)), tau, the occupancy (live rows per round over B: below 1 while the batch fills and as it
drains), a step's draft and verify time, the seconds the steps spent joining requests and in rounds, and the CUDA
graphs the timed run captured; and the one-sequence engine (EagleSpec.generate, the fast path) over the same
prompts, one after another, as the batch-1 baseline. Ratios are against plain batched decoding at the same B,
measured in the same run.

Serve mode: `create_app` under uvicorn on a loopback port (as `eaglespec serve`), --requests chat requests
sent one after another, then the same requests at once: wall seconds of each and their ratio, with the texts
compared (greedy: they must be equal).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from eaglespec.api import EagleSpec
from eaglespec.datasets import load_prompts
from eaglespec.engine.batch import BatchEngine, BatchRequest
from eaglespec.engine.build import build_batch_engine
from eaglespec.sampling import SamplingConfig, SamplingParams


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))] if values else 0.0


def timed(run, *args) -> dict:
    """The second of two runs: the first compiles the kernels for every shape and length the run meets."""
    run(*args)
    return run(*args)


def run_engine(engine: BatchEngine, prompts: list[list[int]], max_new_tokens: int, eos: list[int],
               sampling: list[SamplingConfig | None]) -> dict:
    """All prompts submitted at once (request i sampled by sampling[i], None: greedy); per-request first-token and
    finish times from the step events."""
    sync = torch.cuda.synchronize if engine.device.type == "cuda" else (lambda: None)
    sync()
    graphs, seconds, steps = engine.graphs, dict(engine.seconds), engine.rounds
    t0 = time.perf_counter()
    reqs = [engine.submit(BatchRequest(p, max_new_tokens, eos, s)) for p, s in zip(prompts, sampling)]
    first: dict[int, float] = {}
    done: dict[int, float] = {}
    while not all(r.done for r in reqs):
        events = engine.step()
        now = time.perf_counter()
        for r, tokens in events:
            if tokens:
                first.setdefault(id(r), now)
        for r in reqs:
            if r.done and id(r) not in done:
                done[id(r)] = now
    sync()
    wall = time.perf_counter() - t0
    n = sum(len(r.result.token_ids) for r in reqs)
    ttft = [first[id(r)] - t0 for r in reqs]
    tpot = [(done[id(r)] - first[id(r)]) / (len(r.result.token_ids) - 1) for r in reqs
            if len(r.result.token_ids) > 1]
    rounds = sum(len(r.result.rounds) for r in reqs)  # row-rounds: each live row once per round
    steps = engine.rounds - steps
    accepted = sum(rd.accepted for r in reqs for rd in r.result.rounds)
    every = [rd for r in reqs for rd in r.result.rounds]  # a step's times, once per row in it
    draft_ms = 1e3 * statistics.mean(rd.draft_s for rd in every) if every else 0.0
    verify_ms = 1e3 * statistics.mean(rd.verify_s + rd.commit_s for rd in every) if every else 0.0
    return {"draft_ms": draft_ms, "verify_ms": verify_ms, "tokens": n, "seconds": wall, "tokens_per_s": n / wall, "ttft_p50": _pct(ttft, 0.5),
            "ttft_p99": _pct(ttft, 0.99), "tpot_p50": _pct(tpot, 0.5), "tpot_p99": _pct(tpot, 0.99),
            "tau": 1 + accepted / rounds if rounds else 0.0, "outputs": [r.result.token_ids for r in reqs],
            "join_s": engine.seconds["join"] - seconds["join"], "round_s": engine.seconds["round"] - seconds["round"],
            "new_graphs": engine.graphs - graphs, "rounds": steps,
            "occupancy": rounds / (steps * engine.max_batch) if steps else 0.0}


def engine_mode(args: argparse.Namespace) -> dict:
    es = EagleSpec.from_pretrained(target=args.target, draft=args.draft, device=args.device, dtype=args.dtype,
                                   tree={"tree": args.tree})
    prompts = [es.encode(p) for p in load_prompts(args.dataset, args.limit)]
    eos = es.eos_ids()
    dev = es.model.device
    log(f"{len(prompts)} prompts, {args.max_new_tokens} new tokens, device {dev}, tree {args.tree}, temperature "
        f"{args.temperature}")

    def sampling(i: int) -> SamplingConfig | None:
        """Request i's sampling: the prompt's seed, so that a repeated prompt draws what it draws alone."""
        if not args.temperature:
            return None
        return SamplingConfig(SamplingParams(temperature=args.temperature), seed=args.seed + i % len(prompts))

    def one_sequence() -> list:
        return [es.engine.generate(p, args.max_new_tokens, eos, sampling=sampling(i)) for i, p in enumerate(prompts)]

    solo = one_sequence()  # warm-up: graphs captured, kernels compiled
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    solo = one_sequence()  # the one-sequence fast path, one at a time
    if dev.type == "cuda":
        torch.cuda.synchronize()
    solo_s = time.perf_counter() - t0
    solo_n = sum(len(o.token_ids) for o in solo)
    import transformers

    out = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "torch": torch.__version__,
           "transformers": transformers.__version__, "commit": args.commit, "batch_backend": args.batch_backend,
           "one_sequence": {"tokens_per_s": solo_n / solo_s, "tau": statistics.mean(o.tau for o in solo)},
           "rows": []}
    log(f"one-sequence engine, one request at a time: {solo_n / solo_s:.1f} tok/s")
    for B in args.batches:
        cfg = es.config.replace(max_batch=B, backend=args.batch_backend)
        row = {"batch": B}
        for name, drafter, adaptive in (("plain", None, False), ("speculative", es.drafter, False),
                                        ("adaptive", es.drafter, True)):
            engine = build_batch_engine(es.model, drafter, es.spec, cfg.replace(adaptive=adaptive))
            some = [prompts[i % len(prompts)] for i in range(max(args.per_batch, args.waves * B))]
            r = timed(run_engine, engine, some, args.max_new_tokens, eos, [sampling(i) for i in range(len(some))])
            r["prompts"] = len(some)
            if engine.plan is not None:
                r["plan"] = engine.plan.summary()
                log(f"B={B:3d} {name}: {engine.plan.summary()}")
            same = sum(a == solo[i % len(solo)].token_ids for i, a in enumerate(r.pop("outputs")))
            row[name] = {**r, "same_as_one_sequence": same}
        row["speedup"] = row["speculative"]["tokens_per_s"] / row["plain"]["tokens_per_s"]
        row["adaptive_speedup"] = row["adaptive"]["tokens_per_s"] / row["plain"]["tokens_per_s"]
        out["rows"].append(row)
        p, s = row["plain"], row["speculative"]
        log(f"B={B:3d} plain {p['tokens_per_s']:8.1f} tok/s (ttft p50 {p['ttft_p50']:.3f}s, tpot p50 "
            f"{p['tpot_p50'] * 1e3:.1f} ms) | speculative {s['tokens_per_s']:8.1f} tok/s (ttft p50 "
            f"{s['ttft_p50']:.3f}s, tpot p50 {s['tpot_p50'] * 1e3:.1f} ms, tau {s['tau']:.2f}; a step: draft "
            f"{s['draft_ms']:.1f} ms, verify {s['verify_ms']:.1f} ms) | "
            f"occupancy {p['occupancy']:.2f} / {s['occupancy']:.2f} | {row['speedup']:.2f}x (adaptive {row['adaptive_speedup']:.2f}x) | same tokens as the one-sequence "
            f"engine {p['same_as_one_sequence']}/{s['same_as_one_sequence']} of {p['prompts']}")
        log(f"B={B:3d} seconds joining / in rounds / new CUDA graphs: "
            + " | ".join(f"{name} {row[name]['join_s']:.3f} / {row[name]['round_s']:.3f} / {row[name]['new_graphs']}"
                         for name in ("plain", "speculative", "adaptive")))
    base = out["rows"][0]["plain"]["tokens_per_s"] if out["rows"] else 0
    for row in out["rows"]:
        row["plain_vs_plain_b1"] = row["plain"]["tokens_per_s"] / base if base else 0.0
    return out


def serve_mode(args: argparse.Namespace) -> dict:
    import httpx
    import uvicorn

    from eaglespec.server import create_app

    es = EagleSpec.from_pretrained(target=args.target, draft=args.draft, device=args.device or "cpu",
                                   dtype=args.dtype or "float32", max_batch=args.requests)
    prompts = load_prompts(args.dataset, args.requests)
    server = uvicorn.Server(uvicorn.Config(create_app(es, "bench"), host="127.0.0.1", port=args.port,
                                           log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{args.port}/v1/chat/completions"

    def ask(prompt: str) -> str:
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": args.max_new_tokens}
        return httpx.post(url, json=body, timeout=600).json()["choices"][0]["message"]["content"]

    ask(prompts[0])  # warm-up
    t0 = time.perf_counter()
    one_by_one = [ask(p) for p in prompts]
    seq_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(ask, prompts))
    conc_s = time.perf_counter() - t0
    server.should_exit = True
    out = {"requests": len(prompts), "max_new_tokens": args.max_new_tokens, "one_by_one_s": seq_s,
           "concurrent_s": conc_s, "ratio": conc_s / seq_s, "same_text": sum(a == b for a, b in
                                                                              zip(one_by_one, together))}
    log(f"{len(prompts)} requests: one after another {seq_s:.2f}s, at once {conc_s:.2f}s "
        f"({conc_s / seq_s:.2f}x the time); same text {out['same_text']}/{len(prompts)}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=None)
    ap.add_argument("--draft", default=None)
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--dataset", default="mtbench")
    ap.add_argument("--tree", default="dynamic", choices=["chain", "static", "dynamic"])
    ap.add_argument("--batch-backend", default="auto", choices=["auto", "fast", "hf"],
                    help="the batched engine's target: fast (the fused layers), hf (the model's own forward)")
    ap.add_argument("--batches", default="1,4,16,64", help="comma-separated batch sizes")
    ap.add_argument("--limit", type=int, default=64, help="prompts (engine mode)")
    ap.add_argument("--per-batch", type=int, default=16,
                    help="batch B runs the first max(B, this) prompts (engine mode; default 16)")
    ap.add_argument("--waves", type=int, default=1,
                    help="batch B runs at least this many times B requests, the prompts repeated in order when "
                         "fewer (engine mode): more than one keeps the batch full as rows finish, a serving load")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="every request sampled at this temperature (engine mode; 0: greedy), request i seeded with "
                         "--seed + i for its prompt")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--serve", action="store_true", help="serve mode: the HTTP server, one by one vs at once")
    ap.add_argument("--requests", type=int, default=8, help="requests (serve mode)")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--commit", default="", help="the commit measured (recorded in --json)")
    args = ap.parse_args()
    args.batches = [int(b) for b in args.batches.split(",") if b]
    torch.manual_seed(0)
    out = serve_mode(args) if args.serve else engine_mode(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
