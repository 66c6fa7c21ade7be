"""Draft trees: the spec (chain / static / dynamic), the node list, and its flattened form.

A DraftTree lists nodes in depth order; node 0 is the ROOT: the pending token (the last emitted
token, which has no target KV yet). Every other node is a draft token whose parent comes earlier.
Flattening gives what one verification forward needs: tokens, depths (positions = committed +
depth) and the ancestry mask (a row sees its ancestors and itself only), with no host sync for a
tree whose builder guarantees depth order (`DraftTree.ordered`); retrieve indices on demand.

EAGLE-2 dynamic trees (`grow_dynamic` + `select_tree`) are pure tensor logic over a callback that
returns the children of a layer of nodes, so they are testable without a drafter:
  - depth 1: the root's top-`top_k` children; every later depth expands the `top_k` highest-value
    nodes of the newest layer (one callback = one drafter forward per depth), each giving its
    top-`top_k` children;
  - value of a node = product of the draft confidences on its path, summed in log space with the
    floor log(max(c, 1e-12)); a confidence is the conditional draft probability under the
    parent's prefix (not renormalised over the kept children);
  - the tree is the global top-`budget` candidates by (-log value, depth, node id): ancestor-closed
    by monotonicity (asserted, never repaired). The root is not counted in the budget.
Static trees are fixed lists of child-rank paths (EAGLE-1 `choices`); chains are static trees of
rank-0 paths. All three produce the same DraftTree and flatten alike.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

from eaglespec.errors import EagleSpecError
from eaglespec.kernels import tree as tree_kernels

TreeKind = Literal["chain", "static", "dynamic"]

CONF_FLOOR = 1e-12  # log value floor: log(max(c, 1e-12))
MASS_EPS = 1e-4  # tolerance on the sibling mass sum(c) <= 1

# EAGLE-1's default static tree (SafeAILab eagle/model/choices.py `mc_sim_7b_63`): 25 nodes, depth 5.
MC_SIM_7B_63: tuple[tuple[int, ...], ...] = (
    (0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0),
    (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 1, 1), (0, 2, 0), (0, 2, 1), (1, 0, 0),
    (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2), (0, 0, 0, 0, 0), (0, 0, 0, 0, 1),
)


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise EagleSpecError(f"tree {name} must be an integer >= {minimum}, got {value!r}")


@dataclass(frozen=True)
class TreeSpec:
    """How the proposer grows a tree. budget = draft tokens verified (the root not counted).

    chain: `depth` tokens. dynamic: EAGLE-2 with width `top_k`, max depth `depth`, `budget` nodes.
    static: `choices` (default MC_SIM_7B_63, 25 nodes) cut to paths of length <= depth and the first `budget`
    (static_choices); a budget above the tree's size drafts the whole tree (static_shortfall names it).
    """

    kind: TreeKind = "chain"
    depth: int = 5
    top_k: int = 10
    budget: int = 60
    choices: tuple[tuple[int, ...], ...] | None = None  # static trees: paths of child ranks

    def __post_init__(self) -> None:
        if self.kind not in ("chain", "static", "dynamic"):
            raise EagleSpecError(f"tree kind {self.kind!r} is not one of chain, static, dynamic")
        _check_int("width (top-k)", self.top_k, 1)
        _check_int("depth", self.depth, 0)
        _check_int("budget", self.budget, 0)
        if self.choices is not None:
            object.__setattr__(self, "choices", tuple(tuple(p) for p in self.choices))
            static_layout(self.choices)  # validates

    @property
    def speculates(self) -> bool:
        if self.kind == "chain":
            return self.depth > 0
        if self.kind == "static":
            return self.depth > 0 and self.budget > 0 and bool(self.static_choices())
        return self.depth > 0 and self.budget > 0

    @property
    def max_nodes(self) -> int:
        """The most nodes one tree of this spec verifies, the root included (a dynamic tree's budget + 1 bounds
        it)."""
        if not self.speculates:
            return 1
        if self.kind == "chain":
            return self.depth + 1
        if self.kind == "static":
            return len(self.static_choices()) + 1
        return self.budget + 1

    def static_choices(self) -> tuple[tuple[int, ...], ...]:
        """The static tree's paths after the depth and budget cuts: the paths of length <= depth, then the first
        `budget` of them in the listed order when every path is listed after its parent (a fitted tree lists
        its paths by value: tree_fit.fit_static_tree), else after a stable sort by length. Either way the cut
        is ancestor-closed. A budget above the tree's size keeps the whole tree (static_shortfall says so)."""
        choices = MC_SIM_7B_63 if self.choices is None else self.choices
        kept = [p for p in choices if len(p) <= self.depth]
        if not _parents_first(kept):
            kept.sort(key=len)  # stable: parents first
        return tuple(kept[: self.budget])

    def static_shortfall(self) -> str | None:
        """For a static spec whose budget exceeds its tree: a one-line note naming both numbers, else None."""
        if self.kind != "static":
            return None
        n = len(self.static_choices())
        if n >= self.budget:
            return None
        tree = "EAGLE-1's default tree (mc_sim_7b_63)" if self.choices is None else "the given static tree"
        return (f"static tree: budget {self.budget} asked, but {tree} has {n} nodes at depth <= {self.depth}: "
                f"drafting {n} (bench/fit_static_tree.py fits a larger tree to a drafter)")


def _parents_first(paths: Sequence[tuple[int, ...]]) -> bool:
    """Every path of length > 1 comes after its parent path."""
    seen: set[tuple[int, ...]] = set()
    for p in paths:
        if len(p) > 1 and p[:-1] not in seen:
            return False
        seen.add(p)
    return True


@dataclass
class DraftTree:
    tokens: torch.Tensor  # [N] long, target ids; tokens[0] = root
    parents: torch.Tensor  # [N] long; parents[0] = -1
    depths: torch.Tensor  # [N] long; depths[0] = 0
    logq: torch.Tensor | None = None  # [N] float: log path value (sum of log draft confidences)
    draft_probs: torch.Tensor | None = None  # [N, V] draft distribution each node's children came from
    stats: dict = field(default_factory=dict)
    ordered: bool = False  # the builder guarantees parents[i] < i: flatten skips its (host-syncing) check
    visible: torch.Tensor | None = None  # [N, N] bool: the ancestry mask, where the builder has it (a static
    # tree's, shared by every tree of its shape); flatten computes it otherwise

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])


@dataclass
class FlatTree:
    tokens: torch.Tensor  # [T]
    depths: torch.Tensor  # [T]: positions are committed_len + depth
    parents: torch.Tensor  # [T]
    visible: torch.Tensor  # [T, T] bool: visible[i, j] <=> j is i or an ancestor of i

    @property
    def retrieve(self) -> torch.Tensor:
        """[P, D+1] long: root-to-leaf row paths (one per leaf), padded with -1. Host-syncing: on demand."""
        n, dev = self.tokens.shape[0], self.tokens.device
        has_child = torch.zeros(n, dtype=torch.bool, device=dev)
        has_child[self.parents[1:]] = True
        leaves = (~has_child).nonzero().flatten()
        max_depth = int(self.depths.max()) if n else 0
        retrieve = torch.full((leaves.numel(), max_depth + 1), -1, dtype=torch.long, device=dev)
        path, node = self.visible[leaves].nonzero(as_tuple=True)  # each ancestor has a distinct depth
        retrieve[path, self.depths[node]] = node
        return retrieve


def root_tensor(root: int | torch.Tensor, device: torch.device) -> torch.Tensor:
    """The root token as a [1] long tensor on `device` (an int is written by a fill: no host->device copy)."""
    if isinstance(root, torch.Tensor):
        return root.reshape(1).to(device=device, dtype=torch.long)
    return torch.full((1,), int(root), dtype=torch.long, device=device)


def chain_tree(root: int | torch.Tensor, drafts: torch.Tensor) -> DraftTree:
    """A chain: root, then `drafts` [k] each the child of the previous."""
    device = drafts.device
    k = drafts.shape[0]
    return DraftTree(
        tokens=torch.cat([root_tensor(root, device), drafts.long()]),
        parents=torch.arange(-1, k, device=device),
        depths=torch.arange(0, k + 1, device=device),
        ordered=True,
    )


def ancestry(parents: torch.Tensor, check: bool = True, max_depth: int | None = None) -> torch.Tensor:
    """[N, N] bool: row i sees itself and its ancestors. Requires parents[i] < i (depth order),
    checked with one host sync unless `check=False` (the caller guarantees it).

    Transitive closure of the parent relation by repeated squaring: ceil(log2 N) small matmuls,
    no per-node loop; ceil(log2 max_depth) when the caller knows no node is deeper than `max_depth`
    (k squarings reach ancestors 2^k levels up: a depth-6 tree of 41 nodes takes 3, not 6).
    """
    n = parents.shape[0]
    dev = parents.device
    idx = torch.arange(n, device=dev)
    if check and n and bool(((parents >= idx) | ((parents < 0) & (idx > 0))).any()):
        raise ValueError("tree nodes must be in depth order: every parent must come before its child")
    reach = ((parents[:, None] == idx) | (idx[:, None] == idx)).float()  # [N, N] parent or self
    levels = max(n, 2) if max_depth is None else min(max(n, 2), max(max_depth, 2))  # longest ancestor chain
    for _ in range(math.ceil(math.log2(levels))):
        reach = (reach @ reach).clamp_(max=1.0)
    return reach > 0


def flatten(tree: DraftTree) -> FlatTree:
    """Tokens, depths, parents and the ancestry mask; no host sync when `tree.ordered`."""
    visible = tree.visible if tree.visible is not None else ancestry(tree.parents, check=not tree.ordered)
    return FlatTree(tokens=tree.tokens, depths=tree.depths, parents=tree.parents, visible=visible)


def stack_flat(flats: Sequence[FlatTree]) -> FlatTree:
    """B flattened trees as one FlatTree of [B, W] rows (visible [B, W, W]), each padded to the widest by rows that
    are their own root (token 0, parent -1, depth 0, seeing themselves only: never deeper than the real root)."""
    sizes = [f.tokens.shape[0] for f in flats]
    W, B, dev = max(sizes), len(flats), flats[0].tokens.device
    if min(sizes) == W:  # every tree the same size (e.g. chains of one k): no padding
        return FlatTree(tokens=torch.stack([f.tokens for f in flats]), depths=torch.stack([f.depths for f in flats]),
                        parents=torch.stack([f.parents for f in flats]),
                        visible=torch.stack([f.visible for f in flats]))
    tokens = torch.zeros(B, W, dtype=torch.long, device=dev)
    depths = torch.zeros(B, W, dtype=torch.long, device=dev)
    parents = torch.full((B, W), -1, dtype=torch.long, device=dev)
    visible = torch.eye(W, dtype=torch.bool, device=dev).repeat(B, 1, 1)
    for b, (f, t) in enumerate(zip(flats, sizes)):
        tokens[b, :t], depths[b, :t], parents[b, :t], visible[b, :t, :t] = f.tokens, f.depths, f.parents, f.visible
    return FlatTree(tokens=tokens, depths=depths, parents=parents, visible=visible)


# -- top-k of draft distributions ------------------------------------------------------------------

TOPK_CHUNK = 512  # two-stage top-k: the least chunk length
TOPK_SPLIT_DEVICES = ("cuda",)  # device types that take the two-stage top-k (on CPU torch.topk is faster)


@functools.cache
def _topk_chunks(width: int, k: int, chunk: int) -> int:
    """Chunks of the two-stage top-k over rows of `width`: the most chunks that divide the row with at
    least max(chunk, k) entries each (1 = plain torch.topk)."""
    for chunks in range(width // max(chunk, k, 1), 1, -1):
        if width % chunks == 0:
            return chunks
    return 1


_CHUNK_STARTS: dict[tuple[int, int, torch.device], torch.Tensor] = {}


def _chunk_starts(width: int, length: int, device: torch.device) -> torch.Tensor:
    """[C, 1] long: the first index of each length-`length` chunk of a row of `width`, built once per
    (width, length, device) and then reused (no op per call). Never cached from inside a CUDA-graph capture:
    a tensor first made there holds nothing until its graph replays (TreeGraph captures after warm-up calls,
    which fill the cache)."""
    key = (width, length, device)
    starts = _CHUNK_STARTS.get(key)
    if starts is None:
        starts = torch.arange(0, width, length, device=device)[:, None]
        if device.type != "cuda" or not torch.cuda.is_current_stream_capturing():
            _CHUNK_STARTS[key] = starts
    return starts


def draft_topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.topk(x, k, dim=-1) (values sorted descending) over [..., V], in two stages on CUDA.

    torch.topk of a few long rows (the draft distribution of a tree's newest nodes: [n <= 10, 12000])
    runs one CUDA block per row. Here each row is cut into C chunks of V / C >= TOPK_CHUNK entries: the
    top-k of every chunk (n * C small rows) gives C * k candidates per row, whose top-k is the row's. The
    values are torch.topk's exactly; among exactly tied values the indices returned (and their order)
    may differ from torch.topk's, so every path that must build the same tree (the eager proposer, the
    whole-tree graph) calls this function on the same device. Plain torch.topk off TOPK_SPLIT_DEVICES, or
    when V has no divisor giving chunks of >= max(TOPK_CHUNK, k) entries.
    """
    width = x.shape[-1]
    chunks = _topk_chunks(width, k, TOPK_CHUNK) if x.device.type in TOPK_SPLIT_DEVICES else 1
    if chunks == 1:
        return x.topk(k, dim=-1)
    lead, length = x.shape[:-1], width // chunks
    vals, idx = x.reshape(*lead, chunks, length).topk(k, dim=-1)  # [..., C, k]: indices within the chunk
    idx = idx + _chunk_starts(width, length, x.device)  # [..., C, k] indices in the row
    top, pick = vals.reshape(*lead, chunks * k).topk(k, dim=-1)  # [..., k]
    return top, idx.reshape(*lead, chunks * k).gather(-1, pick)


# -- EAGLE-2 dynamic trees: pure selection logic ----------------------------------------------------

class CandidateBuffers:
    """A dynamic tree's candidate fields, preallocated for a growth whose every layer's shape is known before it
    starts: every row of children has `width` of them (the root's one row, then per depth the min(top_k, size of
    the layer before) expanded nodes' rows: as _grow's top_nodes picks them). The kernel path of Proposer._dynamic
    writes each layer's confidences, tokens, log values and parents straight into its rows (tree_kernels.children's
    `out`, layer(d)), so the growth joins nothing (4 cats a round) and tree_kernels.select_tree checks the
    confidences (conf_rows) in place of _child_flags' ops. depths is a constant of the shape (made once per
    device, never written).
    """

    def __init__(self, width: int, top_k: int, depth: int, device: torch.device):
        rows = [1]  # rows of children per depth: the root's, then the expanded nodes' (top_nodes keeps min(k, m))
        for _ in range(1, depth):
            rows.append(min(top_k, rows[-1] * width))
        self.width, self.rows = width, tuple(rows)
        self.row0 = tuple(sum(rows[:d]) for d in range(len(rows)))  # each depth's first row
        m = sum(rows) * width
        self.conf = torch.empty(m, dtype=torch.float32, device=device)  # [M] the candidates' confidences
        self.tokens = torch.empty(m, dtype=torch.long, device=device)  # [M] draft-vocab ids
        self.logv = torch.empty(m, dtype=torch.float32, device=device)  # [M] log path values
        self.parents = torch.empty(m, dtype=torch.long, device=device)  # [M] candidate ids, -1 = the root
        self.depths = _candidate_depths(self.rows, width, torch.device(device))  # [M] >= 1

    def layer(self, d: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Depth d's candidates (d = 1: the root's children) as [n, width] views: (conf, tokens, logv, parents), in
        tree_kernels.children's `out` order."""
        r0, n, w = self.row0[d - 1], self.rows[d - 1], self.width
        return tuple(x[r0 * w: (r0 + n) * w].view(n, w) for x in (self.conf, self.tokens, self.logv, self.parents))

    @property
    def conf_rows(self) -> torch.Tensor:
        """[R, width]: every row of children's confidences (what _child_flags checks)."""
        return self.conf.view(-1, self.width)


@functools.cache  # never evicted: a captured CUDA graph may read one
def _candidate_depths(rows: tuple[int, ...], width: int, device: torch.device) -> torch.Tensor:
    """CandidateBuffers.depths: rows[d - 1] * width candidates of depth d, for d = 1.. (made once: see constant)."""
    per_depth = torch.tensor(rows, device=device) * width
    return torch.arange(1, len(rows) + 1, device=device).repeat_interleave(per_depth, output_size=sum(rows) * width)


class Candidates:
    """Every node generated while growing a dynamic tree, in generation (= depth) order.

    The children of one expansion ([n, c] from the callback) take the next n*c ids, row-major. The
    growth appends one layer per depth; tokens / parents / depths / logv are joined (one cat each) on
    first read, not at every depth, or, with `buffers`, were written in place (nothing to join). For the
    callback: `start` (first id of the newest layer), `newest_tokens` [m] (that layer's tokens), `newest` [n]
    (the expanded nodes' indices within it) and `newest_values` [n] (their log values).

    A layer's parts are [m] tensors, or any tensors of m elements read row-major (the growth appends
    [n, c] parts, parents and depths as expanded views: no copy per depth); when every part of a field is
    [n_i, c] with one c, the join is one cat along rows whose flat view is the field.
    """

    def __init__(self, tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor, logv: torch.Tensor,
                 buffers: CandidateBuffers | None = None):
        # per field, the layers appended so far: tokens (draft-vocab ids), parents (candidate id of the
        # parent, -1 = the root), depths (>= 1), logv (float: log path value); with buffers, views of them
        self._layers = {"tokens": [tokens], "parents": [parents], "depths": [depths], "logv": [logv]}
        self.buffers = buffers  # every layer written in place (_grow checks the views): the fields are its prefix
        self.expanded: list[torch.Tensor] = []  # per expansion: the candidate ids expanded
        self.size = int(tokens.numel())
        self.start = 0
        self.newest_tokens = tokens.reshape(-1)
        self.newest: torch.Tensor | None = None
        self.newest_values: torch.Tensor | None = None  # [n] fp32: the expanded nodes' log values
        self.levels: torch.Tensor | None = None  # _grow: arange(-1, depth + 1), the root's parent and depths

    def append(self, tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor, logv: torch.Tensor
               ) -> None:
        """A new layer of m candidates (the next m ids): [m] parts, or m elements each read row-major."""
        if self.buffers is None:
            for name, part in (("tokens", tokens), ("parents", parents), ("depths", depths), ("logv", logv)):
                self._layers[name].append(part)
        self.start, self.newest_tokens = self.size, tokens.reshape(-1)
        self.size += int(tokens.numel())

    def _joined(self, name: str) -> torch.Tensor:
        if self.buffers is not None:
            return getattr(self.buffers, name)[: self.size]
        layers = self._layers[name]
        if len(layers) > 1 or layers[0].dim() != 1:
            if len(layers) > 1 and all(x.dim() == 2 for x in layers) and len({x.shape[1] for x in layers}) == 1:
                layers[:] = [torch.cat(layers).reshape(-1)]  # [sum n_i, c] contiguous: the flat view
            elif len(layers) > 1:
                layers[:] = [torch.cat([x.reshape(-1) for x in layers])]
            else:
                layers[:] = [layers[0].reshape(-1)]
        return layers[0]

    @property
    def tokens(self) -> torch.Tensor:  # [M] long
        return self._joined("tokens")

    @property
    def parents(self) -> torch.Tensor:  # [M] long
        return self._joined("parents")

    @property
    def depths(self) -> torch.Tensor:  # [M] long
        return self._joined("depths")

    @property
    def logv(self) -> torch.Tensor:  # [M] float
        return self._joined("logv")


# expand(node_ids [n], candidates, depth of those nodes) -> (child tokens [n, c], child confidences [n, c]), or
# with a third [n, c] tensor, the children's log values already computed: candidates.newest_values [n] (the expanded
# nodes' values) + _log_value(confidences) (tree_kernels.children's with a base)
Expand = Callable[[torch.Tensor, Candidates, int], tuple[torch.Tensor, ...]]


def _child_flags(tokens: torch.Tensor | None, conf: torch.Tensor) -> list[torch.Tensor]:
    """3 0-dim bool tensors, no host sync: (confidence not finite or outside [0,1], duplicate token under
    one parent, sibling mass above 1 + eps). tokens None: distinct by construction (top-k indices), the
    duplicate flag is a constant False."""
    conf = conf.float()
    bad_conf = (conf.clamp(0, 1) != conf).any()  # NaN != NaN; +-inf and values outside [0, 1] move
    if tokens is None:
        dup = constant("false", 0, conf.device)
    else:
        sorted_tok = tokens.sort(dim=-1).values
        dup = (sorted_tok[..., 1:] == sorted_tok[..., :-1]).any()
    mass = (conf.sum(-1) > 1 + MASS_EPS).any()  # a NaN sum compares False (bad_conf reports it)
    return [bad_conf, dup, mass]


def _all_child_flags(tokens: list[torch.Tensor], conf: list[torch.Tensor], distinct: bool = False
                     ) -> list[torch.Tensor]:
    """_child_flags over every expansion's [n_i, c_i] children at once: one batch per width c (3 0-dim
    bool tensors). `distinct`: every row's tokens are distinct by construction: not checked."""
    widths = sorted({t.shape[1] for t in tokens})
    flags = [_child_flags(None if distinct else torch.cat([t for t in tokens if t.shape[1] == c]),
                          torch.cat([x for x in conf if x.shape[1] == c])) for c in widths]
    if len(flags) == 1:
        return flags[0]
    return list(torch.stack([torch.stack(f) for f in flags]).any(dim=0).unbind())


_FLAG_MESSAGES = (
    "draft confidences must be finite and in [0, 1]",
    "a parent has the same child token twice",
    "the confidences of one parent's children sum to more than 1",
)


def _raise_flags(flags: list[bool]) -> None:
    for bad, msg in zip(flags, _FLAG_MESSAGES):
        if bad:
            raise EagleSpecError(f"invalid draft tree input: {msg}")


def _top(values: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest values; ties to the lower index (deterministic)."""
    return values.sort(dim=-1, descending=True, stable=True).indices[..., :k]


def top_nodes(values: torch.Tensor, k: int, start: int, kernels: bool = False
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """values [M] -> (the min(k, M) largest [k'], their indices [k'], the indices plus `start`: the newest layer's
    expanded candidate ids), descending, ties to the lower index: one kernel (tree_kernels.rank_top_ids) with the
    `kernels`, else a stable sort and an add."""
    k = min(k, values.numel())
    if kernels:
        return tree_kernels.rank_top_ids(values, k, start)
    return tree_kernels.rank_top_ids_ref(values, k, start)


def _keep_top_children(tokens: torch.Tensor, conf: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[n, c] children -> the top-k per row by confidence (no-op when already top-k sorted)."""
    order = _top(conf, k)
    return tokens.gather(-1, order), conf.gather(-1, order)


@functools.cache  # never evicted: a captured CUDA graph may read one
def constant(kind: str, n: int, device: torch.device) -> torch.Tensor:
    """A small constant made once per device (never written: every user reads it or copies it), so a round graph
    does not launch a kernel to make it every round: "false" a 0-dim False, "levels" arange(-1, n + 1), "eye" the
    [n, n] bool identity."""
    if kind == "false":
        return torch.zeros((), dtype=torch.bool, device=device)
    if kind == "levels":
        return torch.arange(-1, n + 1, device=device)
    if kind == "eye":
        return torch.eye(n, dtype=torch.bool, device=device)
    raise ValueError(f"constant: {kind!r}")


def _log_value(conf: torch.Tensor) -> torch.Tensor:
    """log(max(c, 1e-12)) in float32."""
    return conf.float().clamp(min=CONF_FLOOR).log()


def _check_layer(buffers: CandidateBuffers, d: int, conf: torch.Tensor, tokens: torch.Tensor, logv: list[torch.Tensor]
                 ) -> None:
    """With buffers, depth d's children (conf, tokens, log values) must be the views buffers.layer(d) (written in
    place: nothing is joined after the growth). Host-side (pointers and shapes): no sync."""
    want = buffers.layer(d)[:3]
    if len(logv) != 1 or any(x.data_ptr() != w.data_ptr() or x.shape != w.shape
                             for x, w in zip((conf, tokens, logv[0]), want)):
        raise ValueError(f"dynamic tree growth: depth {d}'s children (conf, tokens, log values) must be written into "
                         "CandidateBuffers.layer(d) and returned as those views")


def _grow(root_tokens: torch.Tensor, root_conf: torch.Tensor, expand: Expand, top_k: int, depth: int,
          sorted_children: bool, distinct_children: bool = False, root_logv: torch.Tensor | None = None,
          buffers: CandidateBuffers | None = None, kernels: bool = False
          ) -> tuple[Candidates, list[torch.Tensor] | None]:
    """grow_dynamic without reading anything back: (candidates, 3 0-dim bool validation flags on the device, or
    None with `buffers`: the caller checks buffers.conf_rows, e.g. in tree_kernels.select_tree).

    Per depth: the top of the newest layer's values (top_nodes), the callback, and 4 small ops (fixed
    shapes: the layer has min(top_k, size of the newest layer) nodes): candidate ids, log values (clamp,
    log, add); parents and depths are views (of the ids, of one arange per growth). The layers are joined
    once, at the first read of the candidates' fields. `distinct_children`: no row of children repeats a
    token (e.g. top-k indices): the duplicate check is skipped. `root_logv` [c]: the root's children's log
    values when the caller has them (tree_kernels.children's), else _log_value(root_conf) (2 ops).
    `buffers` (sorted, distinct children only): the root's children and every callback's are views of
    buffers.layer(d), written there with their parents (see CandidateBuffers) and returned with their log
    values: no log value ops, no joins, no flags.
    """
    if buffers is not None and not (sorted_children and distinct_children):
        raise ValueError("dynamic tree growth: CandidateBuffers take sorted, distinct children only")
    tok, conf = root_tokens.long()[None], root_conf[None]  # [1, c]
    if not sorted_children:
        tok, conf = _keep_top_children(tok, conf, top_k)
    all_tok, all_conf = [tok], [conf]
    levels = constant("levels", depth, root_tokens.device)  # arange(-1, depth + 1): levels[1 + d] = d
    c0 = tok.shape[1]
    # [n, c] values of the newest layer: ids start..start+n*c-1, row-major
    newest_logv = _log_value(conf) if root_logv is None else root_logv.reshape(1, c0)
    if buffers is not None:
        _check_layer(buffers, 1, conf, tok, [newest_logv])
    cand = Candidates(tokens=tok, parents=levels[0].expand(1, c0), depths=levels[2].expand(1, c0),
                      logv=newest_logv, buffers=buffers)
    cand.levels = levels
    for d in range(1, depth):
        # [n] the highest-value nodes of depth d: their values, indices within the layer, candidate ids
        values, cand.newest, layer = top_nodes(newest_logv.reshape(-1), top_k, cand.start, kernels)
        cand.newest_values = values
        cand.expanded.append(layer)
        ctok, cconf, *logv = expand(layer, cand, d)  # [n, c] (from a kernel, also their log values)
        ctok = ctok.long()
        if buffers is not None:
            _check_layer(buffers, d + 1, cconf, ctok, logv)
        if not sorted_children:
            ctok, cconf, logv = *_keep_top_children(ctok, cconf, top_k), []
        all_tok.append(ctok)
        all_conf.append(cconf)
        n, c = ctok.shape
        newest_logv = logv[0] if logv else values[:, None] + _log_value(cconf)  # [n, c]
        cand.append(ctok, layer[:, None].expand(n, c), levels[d + 2].expand(n, c), newest_logv)
    return cand, None if buffers is not None else _all_child_flags(all_tok, all_conf, distinct_children)


def grow_dynamic(root_tokens: torch.Tensor, root_conf: torch.Tensor, expand: Expand, top_k: int, depth: int,
                 validate: bool = True, sorted_children: bool = False) -> tuple[Candidates, list[bool]]:
    """EAGLE-2 expansion. root_tokens/root_conf: [c] the root's children (any c >= 1).

    Depth d+1 candidates come from ONE call `expand(layer, candidates, d)` for the `top_k`
    highest-value candidates of depth d. `sorted_children`: the root's and every callback's
    children are already at most top_k per row, sorted by confidence (descending; the order of
    ties is kept), e.g. the output of Tensor.topk: the top-k re-sort is skipped. Returns the
    candidates and the validation flags (one host sync for the whole growth; raised here when
    `validate`).
    """
    cand, flags = _grow(root_tokens, root_conf, expand, top_k, depth, sorted_children)
    flag_list = torch.stack(flags).tolist()
    if validate:
        _raise_flags(flag_list)
    return cand, flag_list


def select_nodes(cand: Candidates, budget: int, kernels: bool = False) -> torch.Tensor:
    """Global top-`budget` by (-log value, depth, node id) -> candidate ids in depth order.

    Candidate ids are in depth order, so a stable sort on -logv realises the full key.
    """
    b = min(budget, cand.size)
    if b > 0 and kernels:  # two rankings (tree_kernels.rank_top)
        return tree_kernels.rank_top(tree_kernels.rank_top(cand.logv, b)[1], b, descending=False)[0]
    return _top(cand.logv, b).sort().values


def _select(root: int | torch.Tensor, cand: Candidates, budget: int,
            token_map: Callable[[torch.Tensor], torch.Tensor] | None = None, token_table: torch.Tensor | None = None,
            conf: torch.Tensor | None = None, kernels: bool = False
            ) -> tuple[DraftTree, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """select_tree without reading anything back: (tree, 0-dim bool "NOT ancestor-closed" on the device, the chosen
    candidate ids [N-1] of tree nodes 1.., all four flags or None). token_map, or the table token_table [Vd] (one of
    them): applied to the chosen candidates' tokens (not the root's), e.g. draft -> target ids. Without a token_map
    the assembly is one kernel (tree_kernels.select_tree) with the `kernels`; given `conf`
    [R, C] (the candidates' confidences by row: CandidateBuffers.conf_rows, distinct children), that kernel also
    checks them: the fourth output is then grow_dynamic_tree's [4] flags (the duplicate flag False), else None."""
    dev = cand.tokens.device
    root_t = root_tensor(root, dev)
    if budget <= 0 or cand.size == 0:
        tree = chain_tree(root_t, cand.tokens[:0])
        tree.logq = torch.zeros(1, device=dev)
        return tree, torch.zeros((), dtype=torch.bool, device=dev), cand.tokens[:0], None
    chosen = select_nodes(cand, budget, kernels)  # [B] candidate ids, ascending
    if token_map is None and kernels:
        ids, logq, flags = tree_kernels.select_tree(root_t.reshape(1), chosen, cand.parents, cand.tokens, cand.depths,
                                                    cand.logv, token_table, conf, 1 + MASS_EPS)
        tree = DraftTree(tokens=ids[0], parents=ids[1], depths=ids[2], logq=logq, stats={"candidates": cand.size},
                         ordered=True)
        return tree, flags[3], chosen, None if conf is None else flags
    if token_table is not None:
        token_map = token_table.__getitem__
    levels = cand.levels if cand.levels is not None else torch.arange(-1, 1, device=dev)  # [-1, 0, ...]
    parent_ids = cand.parents[chosen]  # [B] candidate ids, -1 = the root
    # tree node of a parent: the chosen id at position j is node j + 1, the root (-1, below every id) node 0
    parents = torch.searchsorted(chosen, parent_ids, right=True)  # [B]
    # closed: every parent is the root or chosen, i.e. [-1, *chosen][parents] == parent_ids
    not_closed = (torch.cat([levels[:1], chosen])[parents] != parent_ids).any()
    tokens = cand.tokens[chosen]
    tree = DraftTree(
        tokens=torch.cat([root_t, tokens if token_map is None else token_map(tokens)]),
        parents=torch.cat([levels[:1], parents]),  # the root's parent: -1
        depths=torch.cat([levels[1:2], cand.depths[chosen]]),  # the root's depth: 0
        logq=torch.cat([torch.zeros(1, device=dev), cand.logv[chosen]]),
        stats={"candidates": cand.size},
        ordered=True,  # chosen ids ascend and every parent id is below its child's: once closed, in order
    )
    return tree, not_closed, chosen, None


_NOT_CLOSED = "dynamic tree selection is not ancestor-closed"  # impossible from valid (monotone) values


def select_tree(root: int | torch.Tensor, cand: Candidates, budget: int) -> DraftTree:
    """The selected candidates as a DraftTree (node 0 = root). Asserts ancestor closure."""
    tree, not_closed, _, _ = _select(root, cand, budget)
    assert not bool(not_closed), _NOT_CLOSED
    return tree


def grow_dynamic_tree(root: int | torch.Tensor, root_tokens: torch.Tensor, root_conf: torch.Tensor, expand: Expand,
                      top_k: int, depth: int, budget: int, sorted_children: bool = False,
                      distinct_children: bool = False,
                      token_map: Callable[[torch.Tensor], torch.Tensor] | None = None,
                      with_chosen: bool = False, token_table: torch.Tensor | None = None,
                      root_logv: torch.Tensor | None = None, buffers: CandidateBuffers | None = None,
                      kernels: bool = False
                      ) -> tuple[DraftTree, torch.Tensor] | tuple[DraftTree, torch.Tensor, torch.Tensor]:
    """dynamic_tree without reading anything back (CUDA-graph capturable when `expand` is):
    (tree, [4] bool flags on the device: invalid input x3, not ancestor-closed). check_dynamic_flags reads them.
    `distinct_children`: no row of children repeats a token (top-k indices): that check is skipped (its flag
    False). `token_map`: applied to the tree's tokens but the root (e.g. draft -> target ids), before they are
    joined to the root's; or `token_table` [Vd], the same map as a table (no token_map: the final assembly may be
    one kernel, see _select). `with_chosen`: also return the candidate ids [N-1] of tree nodes 1.. (in generation
    order: the callback's children of one expansion are ids start.. row-major). `root_logv` [c]: the root's
    children's log values, when the caller has them. `buffers` (sorted, distinct children): the candidates are
    written in place (see _grow and CandidateBuffers) and, where the assembly is the select_tree kernel, it checks
    their confidences too: the flags are its output (no flag ops); else _child_flags over buffers.conf_rows.
    `kernels`: the ranking and the assembly in the tree kernels (kernels/tree.py), else in torch.
    """
    _check_int("width (top-k)", top_k, 1)
    _check_int("depth", depth, 0)
    _check_int("budget", budget, 0)
    if depth == 0 or budget == 0:
        tree = chain_tree(root, root_tokens.new_empty(0).long())
        flags = torch.zeros(4, dtype=torch.bool, device=root_tokens.device)
        return (tree, flags, root_tokens.new_empty(0).long()) if with_chosen else (tree, flags)
    cand, flags = _grow(root_tokens, root_conf, expand, top_k, depth, sorted_children, distinct_children, root_logv,
                        buffers, kernels)
    conf = None if buffers is None else buffers.conf_rows
    tree, not_closed, chosen, checked = _select(root, cand, budget, token_map, token_table, conf, kernels)
    if checked is None:
        if flags is None:  # buffers, assembled in torch: their confidences checked in place (no join)
            flags = _child_flags(None, conf)
        checked = torch.stack([*flags, not_closed])
    return (tree, checked, chosen) if with_chosen else (tree, checked)


def check_dynamic_flags(flags: torch.Tensor) -> None:
    """Raise on grow_dynamic_tree's [4] flags: ONE host read."""
    *bad, not_closed = flags.tolist()
    _raise_flags(bad)
    assert not not_closed, _NOT_CLOSED


def dynamic_tree(root: int | torch.Tensor, root_tokens: torch.Tensor, root_conf: torch.Tensor, expand: Expand,
                 top_k: int, depth: int, budget: int, sorted_children: bool = False) -> DraftTree:
    """EAGLE-2: grow then select, validated in ONE host sync at the end. budget 0 or depth 0 = the root alone.

    `sorted_children`: see grow_dynamic.
    """
    tree, flags = grow_dynamic_tree(root, root_tokens, root_conf, expand, top_k, depth, budget, sorted_children)
    check_dynamic_flags(flags)
    return tree


# -- static trees -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class StaticLayout:
    """A static tree's shape: node 0 = root, nodes in depth order."""

    parents: tuple[int, ...]  # [N]
    ranks: tuple[int, ...]  # [N]: child rank under the parent (root: -1)
    depths: tuple[int, ...]  # [N]
    max_rank: int


def static_layout(choices: Sequence[Sequence[int]]) -> StaticLayout:
    """Validate EAGLE-1-style `choices` (paths of child ranks) and lay the tree out in depth order."""
    paths = [tuple(p) for p in choices]
    seen: set[tuple[int, ...]] = set()
    for p in paths:
        if not p or any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in p):
            raise EagleSpecError(f"static tree path {list(p)} must be a non-empty list of ranks >= 0")
        if p in seen:
            raise EagleSpecError(f"static tree path {list(p)} appears twice")
        seen.add(p)
    for p in paths:
        if len(p) > 1 and p[:-1] not in seen:
            raise EagleSpecError(f"static tree path {list(p)} has no parent path {list(p[:-1])}")
    ordered = sorted(paths, key=lambda p: (len(p), p))
    index = {(): 0}
    parents, ranks, depths = [-1], [-1], [0]
    for i, p in enumerate(ordered, start=1):
        index[p] = i
        parents.append(index[p[:-1]])
        ranks.append(p[-1])
        depths.append(len(p))
    return StaticLayout(tuple(parents), tuple(ranks), tuple(depths), max(ranks))
