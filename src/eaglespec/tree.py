"""Draft trees: the spec (chain / static / dynamic), the node list, and its flattened form.

A DraftTree lists nodes in depth order; node 0 is the ROOT: the pending token (the last emitted
token, which has no target KV yet). Every other node is a draft token whose parent comes earlier.
Flattening gives what one verification forward needs: tokens, depths (positions = committed +
depth), the ancestry mask (a row sees its ancestors and itself only), and retrieve indices.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

TreeKind = Literal["chain", "static", "dynamic"]


@dataclass(frozen=True)
class TreeSpec:
    """How the proposer grows a tree. budget = draft tokens verified (the root not counted)."""

    kind: TreeKind = "chain"
    depth: int = 5
    top_k: int = 10
    budget: int = 60
    choices: tuple[tuple[int, ...], ...] | None = None  # static trees: paths of child ranks

    @property
    def speculates(self) -> bool:
        if self.kind == "chain":
            return self.depth > 0
        return self.depth > 0 and self.budget > 0 and (self.kind != "static" or bool(self.choices))


@dataclass
class DraftTree:
    tokens: torch.Tensor  # [N] long, target ids; tokens[0] = root
    parents: torch.Tensor  # [N] long; parents[0] = -1
    depths: torch.Tensor  # [N] long; depths[0] = 0
    logq: torch.Tensor | None = None  # [N] float: log path value (sum of log draft confidences)
    draft_probs: torch.Tensor | None = None  # [N, V] draft distribution each node's children came from
    stats: dict = field(default_factory=dict)

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])


@dataclass
class FlatTree:
    tokens: torch.Tensor  # [T]
    depths: torch.Tensor  # [T]
    parents: torch.Tensor  # [T]
    visible: torch.Tensor  # [T, T] bool: visible[i, j] <=> j is i or an ancestor of i
    retrieve: torch.Tensor  # [P, D+1] long: root-to-leaf row paths, padded with -1


def chain_tree(root: int | torch.Tensor, drafts: torch.Tensor) -> DraftTree:
    """A chain: root, then `drafts` [k] each the child of the previous."""
    device = drafts.device
    k = drafts.shape[0]
    root_t = torch.as_tensor(root, dtype=torch.long, device=device).reshape(1)
    return DraftTree(
        tokens=torch.cat([root_t, drafts.long()]),
        parents=torch.arange(-1, k, device=device),
        depths=torch.arange(0, k + 1, device=device),
    )


def ancestry(parents: torch.Tensor) -> torch.Tensor:
    """[N, N] bool: row i sees itself and its ancestors. Requires parents[i] < i (depth order)."""
    n = parents.shape[0]
    if n and bool((parents >= torch.arange(n, device=parents.device)).any()):
        raise ValueError("tree nodes must be in depth order: every parent must come before its child")
    visible = torch.eye(n, dtype=torch.bool, device=parents.device)
    for i in range(1, n):  # rows depend only on earlier rows
        visible[i] |= visible[parents[i]]
    return visible


def flatten(tree: DraftTree) -> FlatTree:
    visible = ancestry(tree.parents)
    n = tree.size
    has_child = torch.zeros(n, dtype=torch.bool, device=tree.tokens.device)
    has_child[tree.parents[1:]] = True
    leaves = (~has_child).nonzero().flatten()
    max_depth = int(tree.depths.max()) if n else 0
    retrieve = torch.full((leaves.numel(), max_depth + 1), -1, dtype=torch.long, device=tree.tokens.device)
    for r, leaf in enumerate(leaves.tolist()):
        rows = visible[leaf].nonzero().flatten()  # ancestors in depth order
        retrieve[r, : rows.numel()] = rows
    return FlatTree(tokens=tree.tokens, depths=tree.depths, parents=tree.parents, visible=visible,
                    retrieve=retrieve)
