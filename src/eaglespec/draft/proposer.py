"""The proposer: keeps the drafter's KV in step with the verified prefix and grows draft trees.

Index shift (DESIGN.md contract 4): drafter row t pairs the target feature f_t with the
embedding of token x_{t+1}, sits at position t, and predicts x_{t+2}. With the target committed
through row n-1 and the pending root token x_n, the last catch-up row is t = n-1; a draft node
at depth d (token y_d at sequence position n+d) is the drafter row n+d-1.
"""

from __future__ import annotations

import torch
from torch import nn

from ..sampling import SamplingParams, process_logits, sample, sample_without_replacement
from ..tree import Candidates, DraftTree, TreeSpec, chain_tree, dynamic_tree, static_layout


def shifted_tokens(ids: torch.Tensor, start: int, count: int) -> torch.Tensor:
    """The tokens paired with features f_start .. f_{start+count-1}: x_{t+1} for each t (contract 4)."""
    return ids[start + 1 : start + 1 + count]


class EagerRows:
    """The default drafter-row runner: the drafter over its growing KV (KVCache, torch.cat).

    A row runner appends drafter rows after the `length` rows already in the drafter's KV:
    run(state [n, H], tokens [n], positions [n], visible [n, length+n] bool | None = causal)
    -> (draft logits [n, Vd], states [n, H]); crop(n) keeps the first n rows. The static,
    CUDA-graph-capturable runner (draft/fast.py, StaticDraftRunner) has the same interface.
    """

    def __init__(self, drafter: nn.Module):
        self.drafter = drafter
        self.reset()

    def reset(self) -> None:
        self.cache = self.drafter.new_cache()

    @property
    def length(self) -> int:
        return self.cache[0].length

    def run(self, state: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
            visible: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return self.drafter(state, tokens, positions, self.cache, visible=visible)

    def crop(self, n: int) -> None:
        for layer in self.cache:
            layer.crop(n)


class Proposer:
    # sampling (issue 4; set by the engine): draft processors (None = greedy drafting) and generator
    sampling: SamplingParams | None = None
    generator: torch.Generator | None = None

    def __init__(self, drafter: nn.Module, spec: TreeSpec, runner=None):
        self.drafter = drafter
        self.spec = spec
        self.runner = runner if runner is not None else EagerRows(drafter)  # runs the drafter rows
        self.reset()

    def reset(self) -> None:
        self.runner.reset()
        self.committed = 0  # drafter rows 0..committed-1 are in its KV

    @property
    def cache(self):
        """The eager runner's per-layer KVCache list (tests inspect it)."""
        return self.runner.cache

    @property
    def device(self) -> torch.device:
        return next(self.drafter.parameters()).device

    @torch.no_grad()
    def catch_up(self, features: torch.Tensor, next_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append drafter rows for newly verified target features.

        features: [m, F] = f_t for t = committed..committed+m-1; next_tokens: [m] = x_{t+1}.
        Returns (draft logits [Vd], state [H]) of the last row: it predicts the first draft token.
        """
        m = features.shape[0]
        positions = torch.arange(self.committed, self.committed + m, device=self.device)
        state = self.drafter.project(features.to(self.device))
        logits, states = self.runner.run(state, next_tokens.to(self.device), positions)
        self.committed += m
        return logits[-1], states[-1]

    def _discard_tree_rows(self) -> None:
        self.runner.crop(self.committed)

    @torch.no_grad()
    def propose(self, root: int, features: torch.Tensor, next_tokens: torch.Tensor) -> DraftTree:
        """Catch up on verified rows, then grow the tree below `root` (the pending token)."""
        logits, state = self.catch_up(features, next_tokens)
        try:
            if self.spec.kind == "chain":
                return self._chain(root, logits, state)
            if self.spec.kind == "dynamic":
                return self._dynamic(root, logits, state)
            return self._static(root, logits, state)
        finally:
            self._discard_tree_rows()

    def _chain(self, root: int, logits: torch.Tensor, state: torch.Tensor) -> DraftTree:
        """Greedy chain of spec.depth tokens: one drafter row per depth, causal over the chain."""
        k = self.spec.depth
        drafts = torch.empty(k, dtype=torch.long, device=self.device)
        logq = torch.zeros(k + 1, device=self.device)  # log path value (telemetry: draft confidence)
        sampled = self.sampling is not None and not self.sampling.greedy
        draft_probs = torch.zeros(k + 1, self.drafter.cfg.vocab_size, device=self.device) if sampled else None
        for d in range(1, k + 1):
            if sampled:  # x_d ~ q_d (processed draft distribution), recorded for rejection sampling
                probs = self.draft_dist(logits)  # [Vd]
                draft_id = sample(probs, self.generator).reshape(1)
                draft_probs[d - 1] = self.to_target_probs(probs)
            else:
                draft_id = logits.argmax(-1, keepdim=True)  # [1]
            logq[d] = logq[d - 1] + torch.log_softmax(logits.float(), -1)[draft_id[0]]
            token = self.drafter.to_target_ids(draft_id)  # [1]
            drafts[d - 1] = token[0]
            if d == k:
                break
            position = torch.tensor([self.committed + d - 1], device=self.device)
            out, st = self.runner.run(state[None], token, position)
            logits, state = out[0], st[0]
        tree = chain_tree(root, drafts)
        tree.logq = logq
        tree.draft_probs = draft_probs
        return tree

    # -- sampling helpers (issue 4): the draft processors, shared by every tree policy -------------
    def draft_dist(self, logits: torch.Tensor) -> torch.Tensor:
        """[..., Vd] draft logits -> probabilities under the draft processors (softmax when greedy)."""
        if self.sampling is None or self.sampling.greedy:
            return torch.softmax(logits.float(), dim=-1)
        return process_logits(logits, self.sampling)

    def to_target_probs(self, probs: torch.Tensor) -> torch.Tensor:
        """[..., Vd] over the draft vocab -> [..., V] over the target vocab (d2t, contract 5)."""
        vd = probs.shape[-1]
        out = probs.new_zeros(*probs.shape[:-1], self.drafter.cfg.vocab_size)
        ids = self.drafter.to_target_ids(torch.arange(vd, device=probs.device))
        return out.index_copy_(out.dim() - 1, ids, probs)

    def sample_children(self, logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Children for a FIXED-SHAPE sampled tree: k draws without replacement per row, in draw order.

        logits [n, Vd] -> (target ids [n, k'], q [n, V] over the target vocab), k' = min(k, smallest
        support). Append the children in this order and set DraftTree.draft_probs[node] = q: then
        verify.sample_accept applies recursive rejection sampling with the without-replacement
        correction (sampling.py). Policies that pick children deterministically (top-k, reranked
        dynamic trees) must NOT record draft_probs: they get the point-mass scheme.
        """
        probs = self.draft_dist(logits)  # [n, Vd]
        k = min(k, int((probs > 0).sum(-1).min()))
        draft_ids = sample_without_replacement(probs, k, self.generator)  # [n, k]
        return self.drafter.to_target_ids(draft_ids), self.to_target_probs(probs)

    # -- trees: one drafter forward per depth over the nodes of that depth --------------------------
    def _tree_forward(self, tokens: torch.Tensor, parent_rows: torch.Tensor, states: torch.Tensor,
                      depth: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Append drafter rows for `tokens` [n] (target ids) at tree depth `depth`.

        parent_rows: [n] tree-row index of each node's parent (-1 = the root, i.e. the last
        committed row); states: [n, H] the states that predicted the nodes. Each new row sees the
        committed rows, its ancestors' tree rows and itself (mask over the drafter's KV).
        Returns (draft probabilities [n, Vd] of the children, output states [n, H]).
        """
        n, dev = tokens.shape[0], self.device
        past = self._tree_vis.shape[0]
        anc = torch.where((parent_rows >= 0)[:, None], self._tree_vis[parent_rows.clamp(min=0)],
                          False) if past else self._tree_vis.new_zeros(n, 0)  # [n, past]
        eye = torch.eye(n, dtype=torch.bool, device=dev)
        self._tree_vis = torch.cat([torch.cat([self._tree_vis, self._tree_vis.new_zeros(past, n)], dim=1),
                                    torch.cat([anc, eye], dim=1)])
        visible = torch.cat([torch.ones(n, self.committed, dtype=torch.bool, device=dev), anc, eye], dim=1)
        positions = torch.full((n,), self.committed + depth - 1, dtype=torch.long, device=dev)
        logits, out = self.runner.run(states, tokens, positions, visible)
        return self.draft_dist(logits), out  # ranked under the draft processors (issue 4)

    def _dynamic(self, root: int, logits: torch.Tensor, state: torch.Tensor) -> DraftTree:
        """EAGLE-2 dynamic tree (tree.dynamic_tree) with the drafter as the expansion callback."""
        spec, dev = self.spec, self.device
        k = min(spec.top_k, logits.shape[-1])
        self._tree_vis = torch.zeros(0, 0, dtype=torch.bool, device=dev)
        n_max = k + max(spec.depth - 2, 0) * k * k  # candidates that can ever be expanded
        row_of = torch.full((n_max,), -1, dtype=torch.long, device=dev)  # candidate -> tree row
        out_states = [state[None]]  # row r's output state is out_states_cat[r + 1]; [0] = root state

        def expand(nodes: torch.Tensor, cand: Candidates, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
            par = cand.parents[nodes]
            parent_rows = torch.where(par >= 0, row_of[par.clamp(min=0)], -1)
            states = torch.cat(out_states)[parent_rows + 1]  # the parent row's output (root: catch-up)
            rows = torch.arange(self._tree_vis.shape[0], self._tree_vis.shape[0] + nodes.numel(), device=dev)
            probs, out = self._tree_forward(self.drafter.to_target_ids(cand.tokens[nodes]), parent_rows, states,
                                            depth)
            row_of[nodes] = rows
            out_states.append(out)
            conf, tok = probs.topk(k, dim=-1)
            return tok, conf

        root_conf, root_tok = self.draft_dist(logits).topk(k)
        tree = dynamic_tree(root, root_tok, root_conf, expand, k, spec.depth, spec.budget)
        tree.tokens[1:] = self.drafter.to_target_ids(tree.tokens[1:])  # draft ids -> target ids (d2t)
        return tree

    def _static(self, root: int, logits: torch.Tensor, state: torch.Tensor) -> DraftTree:
        """A fixed tree of child-rank paths (EAGLE-1 `choices`): one drafter forward per depth.

        Greedy drafting: the child of rank r is the parent's r-th most likely draft token
        (deterministic; verified with the point-mass scheme under sampling). Sampled drafting
        (issue 4): a node with c children (c fixed by the layout) gets c draws WITHOUT replacement
        from its processed draft distribution q, in node order, and q is recorded in draft_probs
        (recursive rejection sampling with real q). Children beyond q's support are dropped
        (with their subtrees): that depends on q only, never on the drawn values.
        """
        dev = self.device
        layout = self._layout()
        sampled = self.sampling is not None and not self.sampling.greedy
        parents = torch.tensor(layout.parents, device=dev)
        # greedy: the child's rank; sampled: its index among its siblings (= its draw number)
        sibling = _sibling_index(layout.parents)
        ranks = torch.tensor(sibling if sampled else layout.ranks, device=dev)
        depths = torch.tensor(layout.depths, device=dev)
        n = parents.shape[0]
        n_ranks = (max(sibling) if sampled else layout.max_rank) + 1
        if n_ranks > logits.shape[-1]:
            raise ValueError(f"static tree rank {n_ranks - 1} exceeds the draft vocabulary")
        tokens = torch.full((n,), -1, dtype=torch.long, device=dev)  # target ids
        logq = torch.zeros(n, device=dev)
        row_of = torch.full((n,), -1, dtype=torch.long, device=dev)
        self._tree_vis = torch.zeros(0, 0, dtype=torch.bool, device=dev)
        has_child = torch.zeros(n, dtype=torch.bool)
        has_child[list(layout.parents[1:])] = True
        draft_probs = torch.zeros(n, self.drafter.cfg.vocab_size, device=dev) if sampled else None
        alive = torch.ones(n, dtype=torch.bool, device=dev)  # sampled: the draw was inside q's support

        def children(probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            """[rows, Vd] -> (confidences [rows, R], draft ids [rows, R]): top-R, or R draws in order."""
            if not sampled:
                return probs.topk(n_ranks, dim=-1)
            draws = sample_without_replacement(probs, n_ranks, self.generator)  # zero-q tokens come last
            return probs.gather(-1, draws), draws

        # children of the root come from the catch-up row
        root_probs = self.draft_dist(logits)[None]  # [1, Vd]
        batch_conf, batch_top = children(root_probs)  # [rows expanded at d-1, R]
        if sampled:
            draft_probs[0] = self.to_target_probs(root_probs[0])
        slot_of = torch.zeros(n, dtype=torch.long, device=dev)  # node -> its row in that batch
        max_depth = max(layout.depths)
        state_rows = state[None]  # [1, H] states of the expanded nodes at the previous depth
        for d in range(1, max_depth + 1):
            nodes = [i for i in range(n) if layout.depths[i] == d]
            idx = torch.tensor(nodes, device=dev)
            slot = slot_of[parents[idx]]
            draft_ids = batch_top[slot, ranks[idx]]
            conf = batch_conf[slot, ranks[idx]]
            tokens[idx] = self.drafter.to_target_ids(draft_ids)
            logq[idx] = logq[parents[idx]] + conf.clamp(min=1e-12).log()
            if sampled:
                alive[idx] = alive[parents[idx]] & (conf > 0)
            if d == max_depth:
                break
            exp_nodes = [i for i in nodes if has_child[i]]
            if not exp_nodes:
                break
            eidx = torch.tensor(exp_nodes, device=dev)
            eslot = slot_of[parents[eidx]]
            parent_rows = row_of[parents[eidx]]
            start = self._tree_vis.shape[0]
            probs, out = self._tree_forward(tokens[eidx], parent_rows, state_rows[eslot], d)
            row_of[eidx] = torch.arange(start, start + len(exp_nodes), device=dev)
            slot_of[eidx] = torch.arange(len(exp_nodes), device=dev)
            batch_conf, batch_top = children(probs)
            if sampled:
                draft_probs[eidx] = self.to_target_probs(probs)
            state_rows = out
        tokens[0] = root
        tree = DraftTree(tokens=tokens, parents=parents, depths=depths, logq=logq, draft_probs=draft_probs)
        return _keep_nodes(tree, alive) if sampled else tree

    def _layout(self):
        if getattr(self, "_layout_cache", None) is None or self._layout_cache[0] != self.spec:
            self._layout_cache = (self.spec, static_layout(self.spec.static_choices()))
        return self._layout_cache[1]


def _sibling_index(parents: tuple[int, ...]) -> list[int]:
    """Each node's index among its parent's children, in node order (root: -1)."""
    seen: dict[int, int] = {}
    out = [-1]
    for p in parents[1:]:
        out.append(seen.get(p, 0))
        seen[p] = out[-1] + 1
    return out


def _keep_nodes(tree: DraftTree, keep: torch.Tensor) -> DraftTree:
    """The subtree of the nodes in `keep` [N] bool (ancestor-closed, root kept), renumbered in order."""
    if bool(keep.all()):
        return tree
    kept = keep.nonzero()[:, 0]  # [M] old node ids, in node order
    new_id = torch.cumsum(keep.long(), 0) - 1  # old id -> new id (for kept nodes)
    parents = torch.where(tree.parents[kept] >= 0, new_id[tree.parents[kept].clamp(min=0)], -1)
    return DraftTree(tokens=tree.tokens[kept], parents=parents, depths=tree.depths[kept],
                     logq=None if tree.logq is None else tree.logq[kept],
                     draft_probs=None if tree.draft_probs is None else tree.draft_probs[kept], stats=tree.stats)
