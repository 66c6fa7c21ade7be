"""Acceptance at T=1: real draft probabilities vs the point-mass scheme (issue 4), same drafter/prompts.

Target: a tiny random Llama (vocab 16, 2 layers, logits x3 as in tests/test_sampling.py). Drafter:
w * target logits + (1 - w) * an independent tiny Llama's logits (w: how well it agrees). Every
context up to depth 3 after each prompt is tabulated once; one verification round from each prompt
is then run for many samples through verify.tree_rejection_sample. tau = tokens emitted per round
(accepted drafts + the correction/bonus token).

    .venv/bin/python bench/sampling_acceptance.py
"""

from __future__ import annotations

import torch

from eaglespec.sampling import SamplingParams, process_logits, sample_without_replacement
from eaglespec.verify import tree_rejection_sample

V = 16
SAMPLES = 20_000
CHAIN = [-1, 0, 1, 2]  # 3 drafts
TREE = [-1, 0, 0, 0, 1, 1, 2, 4]  # 7 drafts: root 3 children, node 1: 2, node 2: 1, node 4: 1


def tiny(seed: int):
    import transformers as tf

    torch.manual_seed(seed)
    cfg = tf.LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    model = tf.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)
    return model


def tables(target, other, prompt: list[int]) -> tuple[dict, dict]:
    """Target and other-model logits [V^3, len(prompt) + 3, V] over every 3-token continuation."""
    grid = torch.cartesian_prod(*[torch.arange(V)] * 3)
    seqs = torch.cat([torch.tensor(prompt).expand(grid.shape[0], -1), grid], dim=1)
    with torch.no_grad():
        lt, lo = 3.0 * target(seqs).logits, 3.0 * other(seqs).logits
    return lt, lo


def round_tau(lt, lo, w: float, template: list[int], scheme: str, gen: torch.Generator) -> float:
    params = SamplingParams(temperature=1.0)
    n, nodes = SAMPLES, len(template)
    children = [[c for c in range(nodes) if template[c] == u] for u in range(nodes)]
    depth = [0] * nodes
    code = torch.zeros(n, nodes, dtype=torch.long)  # index of the node's context in the V^3 grid
    tokens = torch.zeros(n, nodes, dtype=torch.long)
    p_nodes = torch.zeros(n, nodes, V)
    q_nodes = torch.zeros(n, nodes, V)
    P = lt.shape[1] - 4  # prompt length - 1: the position of the depth-0 logits
    for u in range(nodes):
        d = depth[u]
        row = code[:, u] * V ** (3 - d)  # any continuation of this prefix
        p_nodes[:, u] = process_logits(lt[row, P + d], params)
        q_nodes[:, u] = process_logits(w * lt[row, P + d] + (1 - w) * lo[row, P + d], params)
        if not children[u]:
            continue
        m = len(children[u])
        q = q_nodes[:, u]
        draws = sample_without_replacement(q, m, gen) if scheme == "sample" else q.topk(m, dim=-1).indices
        for j, c in enumerate(children[u]):
            depth[c] = d + 1
            tokens[:, c] = draws[:, j]
            code[:, c] = code[:, u] * V + draws[:, j]
    parents = torch.tensor(template).expand(n, -1)
    _, accepted, _ = tree_rejection_sample(tokens, parents, torch.tensor(depth), p_nodes,
                                           q_nodes if scheme == "sample" else None, gen)
    return float(accepted.float().mean()) + 1.0


def main() -> None:
    torch.set_num_threads(1)
    target, other = tiny(5), tiny(11)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, V, (4,), generator=gen).tolist() for _ in range(8)]
    tabs = [tables(target, other, p) for p in prompts]
    print("| drafter (w) | chain k=3 real q | chain k=3 point mass (argmax) | tree 7 real q (w/o repl.) "
          "| tree 7 point mass (top-k) |")
    print("| --- | --- | --- | --- | --- |")
    for w in (0.25, 0.5, 0.75):
        row = []
        for template, scheme in ((CHAIN, "sample"), (CHAIN, "pointmass"), (TREE, "sample"), (TREE, "pointmass")):
            taus = [round_tau(lt, lo, w, template, scheme, gen) for lt, lo in tabs]
            row.append(sum(taus) / len(taus))
        print(f"| {w} | " + " | ".join(f"{t:.3f}" for t in row) + " |")


if __name__ == "__main__":
    main()
