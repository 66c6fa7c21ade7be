"""Aten ops dispatched by one call of the fast target's step (`FastTarget._step`), a CPU proxy for CUDA kernels.

Usage: python bench/step_ops.py [--rows 1 32] [--span 512] [--layers 30] [--root DIR] [--by-op]

Builds a random SmolLM2-135M-shaped Llama (30 layers, hidden 576, 9 heads, 3 kv heads, head_dim 64,
intermediate 1536, vocab 49152; fp32 on CPU, random weights) and counts, with a TorchDispatchMode, the ops one
eager `_step` dispatches for a causal step of `rows` rows over `span` cache slots (tests/_opcount.HostOps):

- work: ops that launch work on CUDA (everything but views and allocations);
- views and allocations: view ops (view/permute/split/t/narrow/..., `_unsafe_view`) and the `empty` family,
  which cost no kernel.

A proxy: on CPU F.rms_norm dispatches 5 ops (pow, mean, add_, rsqrt, mul; one fused kernel on CUDA), and it
cannot see copies made inside a kernel's C++ (torch.roll calls .contiguous() on CUDA for a non-contiguous
input) nor the extra kernels a CUDA op launches (the memset of cuDNN's SDPA).
`--root DIR` runs another checkout's sources (e.g. `git archive <commit> | tar -x -C DIR`) to compare.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from _opcount import HostOps  # noqa: E402

os.environ.setdefault("EAGLESPEC_ONEDNN", "0")  # a CUDA proxy: count the GEMMs F.linear / addmm would run

# non-view ops that launch no kernel (allocations, and the view half of a reshape's copy)
NO_KERNEL = {"aten._unsafe_view.default", "aten.empty.memory_format", "aten.empty_strided.default",
             "aten.new_empty.default"}


def smollm2_like(layers: int):
    """A random Llama with SmolLM2-135M's shapes (fp32, eval)."""
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                         rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True)
    return tf.LlamaForCausalLM(cfg).eval()


def count_step(target, rows: int, span: int) -> HostOps:
    """Ops of one eager causal `_step` of `rows` rows after span - rows committed slots."""
    base = span - rows
    tokens = torch.randint(3, 1000, (rows,))
    positions = base + torch.arange(rows)
    visible = torch.ones(rows, rows, dtype=torch.bool).tril()
    base_t = torch.tensor(base)
    cols = target.cols[:span]
    with torch.no_grad():
        target._step(tokens, positions, visible, base_t, cols)  # warm-up
        with HostOps() as counter:
            target._step(tokens, positions, visible, base_t, cols)
    return counter


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--span", type=int, default=512)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--root", default=None, help="another checkout whose src/ to import")
    ap.add_argument("--by-op", action="store_true", help="list the work ops by name")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(args.root) / "src") if args.root else str(ROOT / "src"))
    from eaglespec.backends.fast import FastTarget

    target = FastTarget(smollm2_like(args.layers), (2, args.layers // 2, args.layers - 3), max_len=args.span,
                        cuda_graphs=False)
    print(f"torch {torch.__version__}, {args.layers} layers, span {args.span}, fast.py from "
          f"{Path(sys.modules['eaglespec.backends.fast'].__file__).resolve()}")
    for rows in args.rows:
        c = count_step(target, rows, args.span)
        work = {name: n for name, n in c.kernels.items() if name not in NO_KERNEL}
        total = sum(work.values())
        print(f"rows {rows:3d}: work ops {total:5d} ({total / args.layers:.2f} per layer), "
              f"views and allocations {c.ops - total:5d}, all {c.ops:5d}")
        if args.by_op:
            for name, n in sorted(work.items(), key=lambda kv: -kv[1]):
                print(f"    {n:5d}  {name}")


if __name__ == "__main__":
    main()
