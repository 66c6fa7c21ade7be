"""Where one EAGLE-3 training step spends its time, on the default target (SmolLM2-135M-Instruct).

Phases (each bracketed by a device synchronize, medians over --steps timed steps after --warmup):
prepare (pack + target forward + soft labels), drafter forward (7 TTT steps), backward, optimizer;
then the top ops of one step under torch.profiler.

    PYTHONPATH=src python bench/train_profile.py --data regen.jsonl [--batch-size 48 --max-length 4096]
        [--ttt-attention dense|factored]

`--ttt-attention factored` (draft/layers.factored_attention) scores the prefix block plus each row's own keys of the
earlier steps instead of SDPA over every step's keys with a dense mask: the report's peak memory says what its
materialized scores cost, and its per-step losses (same batches, same seed) must match the dense run's up to
rounding.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from eaglespec.backends.loading import load_target
from eaglespec.train.data import group_for_packing, read_conversations, tokenize_all
from eaglespec.train.trainer import MicroBatches, TrainConfig, Trainer, new_drafter
from eaglespec.train.vocab import select_draft_vocab, token_counts


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--limit", type=int, default=600)
    ap.add_argument("--batch-size", type=int, default=48)
    ap.add_argument("--max-length", type=int, default=4096)
    ap.add_argument("--draft-vocab", type=int, default=6400)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--ttt-attention", default="dense", choices=["dense", "factored"])
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    dev = torch.device(a.device)
    t0 = time.perf_counter()
    model, tok = load_target(None, device=a.device, dtype="bfloat16" if dev.type == "cuda" else "float32")
    t_load = time.perf_counter() - t0
    convs = read_conversations(a.data, a.limit)
    t0 = time.perf_counter()
    samples = tokenize_all(tok, convs, a.max_length)
    t_tok = time.perf_counter() - t0
    vocab = model.get_output_embeddings().weight.shape[0]
    ids = select_draft_vocab(token_counts(((s.ids, s.loss_mask) for s in samples), vocab), a.draft_vocab)
    cfg = TrainConfig(batch_size=a.batch_size, max_length=a.max_length, device=a.device, progress=False,
                      ttt_attention=a.ttt_attention)
    trainer = Trainer(model, new_drafter(model, "eagle3", ids, 0).to(dev), cfg)
    batches = MicroBatches(samples, a.batch_size, 0)
    phases: dict[str, list[float]] = {"prepare": [], "forward": [], "backward": [], "optimizer": []}
    tokens, losses = [], []

    def step(k: int, record: bool) -> None:
        groups = group_for_packing(batches(k), a.max_length)
        sync(dev)
        t = [time.perf_counter()]
        preps = trainer.prepare_many(groups)
        counts = torch.stack([p.sup.sum(1) for p in preps]).sum(0).float()
        sync(dev)
        t.append(time.perf_counter())
        trainer.drafter.train()
        loss, _ = trainer.micro_loss(preps, counts)
        sync(dev)
        t.append(time.perf_counter())
        loss.backward()
        sync(dev)
        t.append(time.perf_counter())
        torch.nn.utils.clip_grad_norm_(trainer.drafter.parameters(), cfg.clip)
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)
        sync(dev)
        t.append(time.perf_counter())
        if record:
            for name, x, y in zip(phases, t, t[1:]):
                phases[name].append(y - x)
            tokens.append(sum(int(p.packed.valid.sum()) for p in preps))
            losses.append(round(float(loss), 5))
            print(f"step {k}: {len(groups)} packs, {tokens[-1]} tokens, loss {losses[-1]}, "
                  + " ".join(f"{n} {1000 * (y - x):.0f} ms" for n, x, y in zip(phases, t, t[1:])), flush=True)

    for k in range(a.warmup):
        step(k, False)
    for k in range(a.warmup, a.warmup + a.steps):
        step(k, True)
    med = {n: round(1000 * statistics.median(v), 1) for n, v in phases.items()}
    total = sum(med.values()) / 1000
    report = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "torch": torch.__version__,
              "load_s": round(t_load, 1), "tokenize_s_per_1k_convs": round(1000 * t_tok / max(1, len(convs)), 2),
              "batch_size": a.batch_size, "max_length": a.max_length, "ttt_attention": a.ttt_attention,
              "peak_gib": round(torch.cuda.max_memory_allocated(dev) / 2**30, 2) if dev.type == "cuda" else None,
              "median_ms": med, "losses": losses,
              "tokens_per_step": statistics.median(tokens), "tokens_per_s": round(statistics.median(tokens) / total)}
    print(json.dumps(report), flush=True)
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with torch.profiler.profile(activities=acts) as prof:
        step(a.warmup + a.steps, False)
        sync(dev)
    key = "cuda_time_total" if dev.type == "cuda" else "cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=60)
    print(table)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(report, profile=table), f, indent=1)


if __name__ == "__main__":
    main()
