"""Is there a one-time cost per new prompt length? Prefill (target and the drafter's catch-up) runs eagerly at the
prompt's exact size; if an attention backend builds a plan per shape (cuDNN SDPA builds a graph per new shape), every
new prompt length pays it once. This times a short generation twice per length: first sight and repeat.

    PYTHONPATH=src python bench/prefill_shapes.py [--lengths 40,57,83,121,190,260] [--device cuda] [--no-cudnn-sdp]

--no-cudnn-sdp turns off PyTorch's cuDNN attention backend (torch.backends.cuda.enable_cudnn_sdp(False)): if the
first-sight cost is cuDNN building a graph per new shape, it disappears (and the other backends' speed shows).

Rows: plain decoding (the target's prefill only), then the default drafter's chain (the target's shapes are warm
by then, so the first-minus-repeat difference is the drafter's catch-up).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from eaglespec.api import EagleSpec
from eaglespec.engine.loop import SpeculativeEngine
from eaglespec.tree.core import TreeSpec


def timed(engine: SpeculativeEngine, ids: list[int], new: int, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    engine.generate(ids, new)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return 1000 * (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="40,57,83,121,190,260")
    ap.add_argument("--new-tokens", type=int, default=4)
    ap.add_argument("--device", default=None)
    ap.add_argument("--no-cudnn-sdp", action="store_true", help="disable the cuDNN SDPA backend")
    args = ap.parse_args()
    if args.no_cudnn_sdp:
        torch.backends.cuda.enable_cudnn_sdp(False)
    es = EagleSpec.from_pretrained(device=args.device)
    device = next(es.model.parameters()).device
    plain = SpeculativeEngine(es.target, None, TreeSpec("chain", depth=0))
    gen = torch.Generator().manual_seed(0)
    vocab = es.model.get_output_embeddings().weight.shape[0]
    warm = torch.randint(100, vocab, (16,), generator=gen).tolist()
    timed(plain, warm, args.new_tokens, device)
    timed(es.engine, warm, args.new_tokens, device)  # captures the small graphs
    print(f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}, torch {torch.__version__}, "
          f"cuDNN SDPA {'off' if args.no_cudnn_sdp else 'on'}")
    print("| engine | prompt tokens | first ms | repeat ms | first - repeat |")
    print("|---|---|---|---|---|")
    for name, engine in (("plain", plain), ("chain (drafter)", es.engine)):
        for n in (int(x) for x in args.lengths.split(",")):
            ids = torch.randint(100, vocab, (n,), generator=torch.Generator().manual_seed(n)).tolist()
            first = timed(engine, ids, args.new_tokens, device)
            again = timed(engine, ids, args.new_tokens, device)
            print(f"| {name} | {n} | {first:.1f} | {again:.1f} | {first - again:.1f} |", flush=True)


if __name__ == "__main__":
    main()
