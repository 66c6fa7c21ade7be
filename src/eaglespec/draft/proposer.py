"""The proposer: keeps the drafter's KV in step with the verified prefix and grows draft trees.

Index shift (contract 4, docs/contracts.md): drafter row t pairs the target feature f_t with the
embedding of token x_{t+1}, sits at position t, and predicts x_{t+2}. With the target committed
through row n-1 and the pending root token x_n, the last catch-up row is t = n-1; a draft node
at depth d (token y_d at sequence position n+d) is the drafter row n+d-1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from eaglespec.draft.fast import StaticDraftRunner
from eaglespec.draft.tree_graph import MaskRows, NewRows, TreeGraph, finish_tree
from eaglespec.kernels import on_by_default
from eaglespec.kernels import tree as tree_kernels
from eaglespec.sampling import (
    SamplingParams,
    exponential_noise,
    process_logits,
    race_argmax,
    sample_without_replacement,
)
from eaglespec.tree.core import (
    CONF_FLOOR,
    CandidateBuffers,
    Candidates,
    DraftTree,
    StaticLayout,
    TreeSpec,
    chain_tree,
    constant,
    draft_topk,
    grow_dynamic_tree,
    root_tensor,
    static_layout,
)


def to_target_probs(drafter: nn.Module, probs: torch.Tensor) -> torch.Tensor:
    """[..., Vd] over `drafter`'s draft vocab -> [..., V] over the target vocab (d2t, contract 5)."""
    vd = probs.shape[-1]
    out = probs.new_zeros(*probs.shape[:-1], drafter.cfg.vocab_size)
    ids = drafter.to_target_ids(torch.arange(vd, device=probs.device))
    return out.index_copy_(out.dim() - 1, ids, probs)


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


class TreeRows(MaskRows):
    """A draft tree's drafter rows, run through the row runner right after the `committed` rows.

    tree_part [R, R] bool: tree row i sees tree row j (its ancestors' rows and itself); the growth may
    widen a row before running it (inherit). run(states [n, H], tokens [n], depth, r0): tree rows
    r0..r0+n-1 (run in order) at position committed + depth - 1 -> (draft logits [n, Vd], states [n, H]).
    tree_graph.DeviceTreeRows is the same over a static KV with the committed length on the device.
    """

    def __init__(self, runner, committed: int, tree_part: torch.Tensor):
        self.runner, self.committed = runner, committed
        # [R, committed + R]: every committed row, then the tree part; rows r0..r0+n-1 use a prefix view
        self.mask = torch.cat([tree_part.new_ones(tree_part.shape[0], committed), tree_part], dim=1)

    def run(self, states: torch.Tensor, tokens: torch.Tensor, depth: int, r0: int
            ) -> tuple[torch.Tensor, torch.Tensor]:
        n = tokens.shape[0]
        positions = torch.full((n,), self.committed + depth - 1, dtype=torch.long, device=tokens.device)
        return self.runner.run(states, tokens, positions, self.mask[r0: r0 + n, : self.committed + r0 + n])


class Proposer:
    # sampling (set by the engine): draft processors (None = greedy drafting) and generator
    sampling: SamplingParams | None = None
    generator: torch.Generator | None = None

    def __init__(self, drafter: nn.Module, spec: TreeSpec, runner=None, kernels: bool | None = None):
        self.drafter = drafter
        self.spec = spec
        self.runner = runner if runner is not None else EagerRows(drafter)  # runs the drafter rows
        # the tree kernels (kernels/tree.py) or the torch code for the growth (None: kernels.on_by_default)
        self.kernels = on_by_default(self.device) if kernels is None else kernels
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
    def propose(self, root: int | torch.Tensor, features: torch.Tensor, next_tokens: torch.Tensor) -> DraftTree:
        """Catch up on verified rows, then grow the tree below `root` (the pending token): in one
        whole-tree graph where one applies (_tree_graph), else one runner call per depth."""
        logits, state = self.catch_up(features, next_tokens)
        whole = self._tree_graph(logits.shape[-1])
        # a sampled chain's / static tree's noise, drawn before the growth (into the tree graph's static input
        # when there is one)
        noise = self.draft_noise(logits.shape[-1], None if whole is None else whole.noise)
        if whole is not None:
            tree = whole.run(root, logits, state, self.committed)
            if tree is not None:  # None: its capture failed (warned once); the per-step path below
                return tree
        try:
            tree, flags, keep = self.grow(root, logits, state,
                                           lambda part: TreeRows(self.runner, self.committed, part), noise)
            return finish_tree(tree, flags, keep)
        finally:
            self._discard_tree_rows()

    def grow(self, root: int | torch.Tensor, logits: torch.Tensor, state: torch.Tensor, new_rows: NewRows,
              noise: torch.Tensor | None = None) -> tuple[DraftTree, torch.Tensor | None, torch.Tensor | None]:
        """The tree below `root` from the catch-up row's logits [Vd] and state [H]; new_rows(tree_part
        [R, R] bool) gives the tree-row runner (TreeRows, or tree_graph.DeviceTreeRows); noise: a sampled
        chain's or static tree's Exp(1) draws [rows, Vd] (draft_noise), else None. No host sync. Returns
        (tree, a dynamic tree's [4] validation flags or None, a sampled static tree's [N] bool nodes to keep
        or None), still on the device: tree_graph.finish_tree checks and prunes after the growth."""
        if self.spec.kind == "chain":
            return self._chain(root, logits, state, new_rows, noise), None, None
        if self.spec.kind == "dynamic":
            return self._dynamic(root, logits, state, new_rows, noise)
        tree, keep = self._static(root, logits, state, new_rows, noise)
        return tree, None, keep

    @property
    def _sampled(self) -> bool:
        """Drafting under sampling processors (temperature > 0)."""
        return self.sampling is not None and not self.sampling.greedy

    def _kernel_children(self, draft_vocab: int, k: int) -> bool:
        """Children by tree_kernels with the kernels on: greedy drafting by children (softmax, top-k and log value in
        two kernels) instead of draft_dist + draft_topk; sampled drafting by race_children (q's top-k and the
        exponential race's draws in two kernels) over draft_dist's q instead of two draft_topk."""
        return self.kernels and tree_kernels.fits(draft_vocab, k)

    def _tree_graph(self, draft_vocab: int) -> TreeGraph | None:
        """The whole-tree graph (draft/tree_graph.py) for this spec and draft processors, where the runner is
        a StaticDraftRunner with tree_graphs on. The growth draws no random numbers inside: a sampled chain's
        or tree's noise is drawn before the replay into TreeGraph.noise (draft_noise); greedy dynamic trees
        pick children by top-k. A sampled static tree's pruning of children outside q's support (one host
        sync) happens after the replay (tree_graph.finish_tree), as does a sampled dynamic tree's."""
        runner = self.runner
        if not isinstance(runner, StaticDraftRunner) or not runner.tree_graphs or not self.spec.speculates:
            return None
        key = (self.spec, self.sampling if self._sampled else None)
        graph = runner.trees.get(key)
        if graph is None:
            graph = runner.trees[key] = TreeGraph(runner, self.grow, self.tree_rows(draft_vocab), draft_vocab,
                                                  self.noise_rows(draft_vocab))
        return None if graph.failed else graph

    def noise_rows(self, draft_vocab: int) -> int:
        """Rows of Exp(1) noise one growth races over: a sampled chain's k draws, a sampled static or dynamic
        tree's 1 + R expanded nodes (the root, then tree row r at noise row 1 + r); 0 for growths that draw
        nothing."""
        if not self._sampled:
            return 0
        return self.spec.depth if self.spec.kind == "chain" else 1 + self.tree_rows(draft_vocab)

    def draft_noise(self, draft_vocab: int, out: torch.Tensor | None = None) -> torch.Tensor | None:
        """The Exp(1) noise [noise_rows, Vd] of a sampled chain's or static tree's draws, in ONE generator
        call (into `out` when given: the tree graph's static input); None for every other growth."""
        rows = self.noise_rows(draft_vocab)
        if not rows:
            return None
        if out is None:
            out = torch.empty(rows, draft_vocab, dtype=torch.float32, device=self.device)
        return exponential_noise(out, self.generator)

    def tree_rows(self, draft_vocab: int) -> int:
        """Drafter rows one tree runs after the committed ones."""
        spec = self.spec
        if spec.kind == "chain":
            return spec.depth - 1
        if spec.kind == "dynamic":  # every expansion runs min(top_k, Vd) rows
            return (spec.depth - 1) * min(spec.top_k, draft_vocab)
        return self._static_plan(False).tree_visible.shape[0]

    def _chain(self, root: int | torch.Tensor, logits: torch.Tensor, state: torch.Tensor, new_rows: NewRows,
               noise: torch.Tensor | None) -> DraftTree:
        """Chain of spec.depth tokens: one drafter row per depth, causal over the chain.

        Sampled drafting: x_d ~ q_d by the exponential race argmax(q_d / E_d) over noise [k, Vd] drawn
        before the growth (draft_noise), so the growth draws nothing and a CUDA graph can replay it.
        No host sync and a handful of ops per depth besides the drafter step; the chain and its log
        values are assembled once at the end.
        """
        k = self.spec.depth
        rows = new_rows(torch.ones(k - 1, k - 1, dtype=torch.bool, device=logits.device).tril())  # depth d: row d-1
        sampled = self._sampled
        tokens, logps, probs_rows = [], [], []
        for d in range(1, k + 1):
            if sampled:  # x_d ~ q_d (processed draft distribution), recorded for rejection sampling
                probs = self.draft_dist(logits)  # [Vd]
                draft_id = race_argmax(probs, noise[d - 1]).reshape(1)
                probs_rows.append(probs)
            else:
                draft_id = logits.argmax(-1, keepdim=True)  # [1]
            logps.append(torch.log_softmax(logits.float(), -1).gather(-1, draft_id))  # [1]
            tokens.append(self.drafter.to_target_ids(draft_id))  # [1]
            if d == k:
                break
            out, st = rows.run(state[None], tokens[-1], d, d - 1)
            logits, state = out[0], st[0]
        tree = chain_tree(root, torch.cat(tokens))
        tree.logq = torch.cat([logps[0].new_zeros(1), torch.cat(logps).cumsum(0)])  # log path value (telemetry)
        if sampled:  # [k+1, V]: row d-1 = q_d; the last node has no children
            probs = torch.stack(probs_rows)
            tree.draft_probs = self.to_target_probs(torch.cat([probs, probs.new_zeros(1, probs.shape[-1])]))
        return tree

    # -- sampling helpers: the draft processors, shared by every tree policy -----------------------
    def draft_dist(self, logits: torch.Tensor) -> torch.Tensor:
        """[..., Vd] draft logits -> probabilities under the draft processors (softmax when greedy)."""
        if self.sampling is None or self.sampling.greedy:
            return torch.softmax(logits, dim=-1, dtype=torch.float32)  # the cast inside the kernel: one launch
        return process_logits(logits, self.sampling)

    def to_target_probs(self, probs: torch.Tensor) -> torch.Tensor:
        """[..., Vd] over the draft vocab -> [..., V] over the target vocab (d2t, contract 5)."""
        return to_target_probs(self.drafter, probs)

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
    def _dynamic(self, root: int | torch.Tensor, logits: torch.Tensor, state: torch.Tensor, new_rows: NewRows,
                 noise: torch.Tensor | None = None) -> tuple[DraftTree, torch.Tensor, torch.Tensor | None]:
        """EAGLE-2 dynamic tree (tree.grow_dynamic_tree) with the drafter as the expansion callback.

        Fixed shapes: every expansion runs k = min(top_k, Vd) rows (the newest layer always has >= k
        nodes). A node's parent is found by arithmetic (the newest layer holds the previous expansion's
        children, row-major) and its tree mask row by OR-ing in its parent's (rows.inherit). Greedy
        drafting: children by tree.draft_topk (verified with the point-mass scheme under sampling).

        Sampled drafting: an expanded node's children are k draws WITHOUT replacement from its processed
        draft distribution q, in draw order (the exponential race over noise [1 + R, Vd]: row 0 for the
        root's children, 1 + r for tree row r's), and q goes to draft_probs (recursive rejection sampling
        with real q). The growth and the selection value the i-th draw by the i-th LARGEST q of its parent,
        whatever was drawn: a node's draws then rank in draw order, the budget keeps a prefix of them, and
        whether a draw is kept depends only on what ranks above it (never on the draw itself or later ones),
        which keeps the acceptance exact. Draws outside q's support (zero q) are marked off in the keep mask
        [N] (with their subtrees; it depends on q only). No host sync: returns (tree, [4] validation flags,
        keep mask or None when greedy), on the device.
        """
        spec = self.spec
        k = min(spec.top_k, logits.shape[-1])
        sampled = self._sampled
        if sampled and (noise is None or noise.shape[0] != 1 + max(spec.depth - 1, 0) * k):
            raise ValueError("a sampled dynamic tree needs its noise [1 + tree rows, Vd] (Proposer.draft_noise)")
        rows = new_rows(constant("eye", max(spec.depth - 1, 0) * k, logits.device))  # [R, R]: no kernel a round
        prev = _Expansion(out=state[None], row0=0, rows=0)  # depth 0: the catch-up row (not a tree row)
        # sampled: per expansion (the root's first) the q rows [n, Vd], the candidate ids expanded, and per layer
        # of children [n, k] whether each draw is inside q's support (and its ancestors were)
        q_rows: list[torch.Tensor] = []
        expanded: list[torch.Tensor] = []
        alive: list[torch.Tensor] = []
        # the kernels map draft ids through the drafter's table (None: the identity, EAGLE-1's)
        kernel = self._kernel_children(logits.shape[-1], k) and hasattr(self.drafter, "target_id_table")
        table = self.drafter.target_id_table() if kernel else None
        # greedy kernel children go straight into the candidates' preallocated fields (no joins; select_tree checks
        # their confidences: no flag ops)
        buffers = CandidateBuffers(k, k, spec.depth, logits.device) if kernel and not sampled else None

        def children(logits: torch.Tensor, r0: int, parent_alive: torch.Tensor | None,
                     base: torch.Tensor | None = None, nodes: torch.Tensor | None = None, depth: int = 1
                     ) -> tuple[torch.Tensor, ...]:
            """[n, Vd] draft logits of the nodes `nodes` [n] (candidate ids; None: the root) -> (child draft ids
            [n, k], confidences [n, k] sorted descending; with the kernel also their log values [n, k], plus base
            [n] (their parents' values) when given). Greedy with the kernel: written into buffers.layer(depth)
            with their parents (the children's depth: 1 for the root's)."""
            if kernel and not sampled:
                conf, tok, logc = tree_kernels.children(logits, k, CONF_FLOOR, base, out=buffers.layer(depth),
                                                        parent=nodes)
                return tok, conf, logc
            probs = self.draft_dist(logits)
            if kernel:  # the draws (the race over noise rows r0..) valued by rank, in two kernels
                conf, tok, logc = tree_kernels.race_children(probs, noise[r0: r0 + probs.shape[0]], k, CONF_FLOOR,
                                                             base)
                q_rows.append(probs)
                alive.append((conf > 0) & parent_alive[:, None])
                return tok, conf, logc
            conf, tok = draft_topk(probs, k)  # [n, k] sorted: the growth skips its re-sort
            if sampled:  # the draws, valued by rank (see above)
                _, tok = draft_topk(probs.float() / noise[r0: r0 + probs.shape[0]], k)  # zero-q tokens come last
                conf = draw_values(conf, probs, tok)
                q_rows.append(probs)
                alive.append((conf > 0) & parent_alive[:, None])
            return tok, conf

        def expand(nodes: torch.Tensor, cand: Candidates, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
            local = cand.newest  # [n] the nodes' indices within the newest layer (the previous expansion's children)
            n, r0 = local.numel(), prev.row0 + prev.rows  # this expansion's rows: r0..r0+n-1
            if kernel:  # the same three steps in one kernel
                states, tokens = tree_kernels.expand_rows(local, k, prev.out, cand.newest_tokens, table, rows.mask,
                                                          r0, prev.row0, inherit=depth > 1)
            else:
                if depth == 1:  # the root's children: their parent is the last committed row
                    states = prev.out.expand(n, -1)
                else:
                    slot = local // k  # [n] parent's index in the previous expansion
                    states = prev.out[slot]
                    rows.inherit(r0, prev.row0, slot)
                tokens = self.drafter.to_target_ids(cand.newest_tokens[local])
            logits, out = rows.run(states, tokens, depth, r0)
            prev.out, prev.row0, prev.rows = out, r0, n
            if sampled:
                expanded.append(nodes)
                return children(logits, 1 + r0, alive[-1].reshape(-1)[local], cand.newest_values)
            return children(logits, 0, None, cand.newest_values, nodes, depth + 1)

        root_alive = torch.ones(1, dtype=torch.bool, device=logits.device) if sampled else None
        root_tok, root_conf, *root_logv = children(logits[None], 0, root_alive)  # the kernels' log values too
        # children distinct per row, sorted by value; the tree's draft ids -> target ids (d2t) as it is assembled
        tree, flags, chosen = grow_dynamic_tree(root, root_tok[0], root_conf[0], expand, k, spec.depth, spec.budget,
                                                sorted_children=True, distinct_children=True,
                                                token_map=None if kernel else self.drafter.to_target_ids,
                                                token_table=table, with_chosen=True,
                                                root_logv=root_logv[0][0] if root_logv else None, buffers=buffers,
                                                kernels=self.kernels)
        if not sampled:
            return tree, flags, None
        # each node's q: its expansion's row (the root's is row 0), else a zero row (a leaf: no children)
        table = torch.cat([*q_rows, q_rows[0].new_zeros(1, q_rows[0].shape[-1])])  # [1 + E + 1, Vd]
        row_of = chosen.new_full((sum(a.numel() for a in alive),), table.shape[0] - 1)  # candidate id -> q row
        if expanded:
            ids = torch.cat(expanded)
            row_of[ids] = torch.arange(1, 1 + ids.numel(), device=ids.device)
        node_rows = torch.cat([chosen.new_zeros(1), row_of[chosen]])  # [N]
        tree.draft_probs = self.to_target_probs(table[node_rows])  # [N, V]
        keep = torch.cat([torch.ones(1, dtype=torch.bool, device=chosen.device),
                          torch.cat([a.reshape(-1) for a in alive])[chosen]])
        return tree, flags, keep

    def _static(self, root: int | torch.Tensor, logits: torch.Tensor, state: torch.Tensor, new_rows: NewRows,
                noise: torch.Tensor | None = None) -> tuple[DraftTree, torch.Tensor | None]:
        """A fixed tree of child-rank paths (EAGLE-1 `choices`): one drafter forward per depth.

        Greedy drafting: the child of rank r is the parent's r-th most likely draft token
        (deterministic; verified with the point-mass scheme under sampling). Sampled drafting:
        a node with c children (c fixed by the layout) gets c draws WITHOUT replacement
        from its processed draft distribution q, in node order, and q is recorded in draft_probs
        (recursive rejection sampling with real q). The draws are the exponential race top-c of
        q / E over noise [1 + R, Vd] drawn before the growth (draft_noise: row 0 for the root's
        children, row 1 + r for tree row r's), so the growth draws nothing. Children beyond q's
        support (zero q: they lose every race) are marked off in the returned keep mask [N] bool
        (with their subtrees): that depends on q only, never on the drawn values;
        tree_graph.finish_tree drops them after the growth (one host sync).

        Every index is precomputed per layout (StaticPlan): no host sync and no host->device copy;
        the nodes of each depth are gathered in one op. Returns (tree, keep mask or None when greedy).
        """
        sampled = self._sampled
        plan = self._static_plan(sampled)
        if plan.n_ranks > logits.shape[-1]:
            raise ValueError(f"static tree rank {plan.n_ranks - 1} exceeds the draft vocabulary")
        rows = new_rows(plan.tree_visible)

        kernel = not sampled and self._kernel_children(logits.shape[-1], plan.n_ranks)  # greedy children
        race_kernel = sampled and self._kernel_children(logits.shape[-1], plan.n_ranks)  # the draws' race

        def children(probs: torch.Tensor, race: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
            """[rows, Vd] -> (confidences [rows, R], draft ids [rows, R]): top-R, or R draws in order
            (race [rows, Vd]: their Exp(1) noise, as in sampling.sample_without_replacement). With the kernel,
            `probs` are the draft logits."""
            if kernel:
                return tree_kernels.children(probs, plan.n_ranks, CONF_FLOOR)[:2]
            if not sampled:
                return draft_topk(probs, plan.n_ranks)
            if race_kernel:
                draws = tree_kernels.race_children(probs, race, plan.n_ranks, CONF_FLOOR)[1]
            else:
                _, draws = draft_topk(probs.float() / race, plan.n_ranks)  # zero-q tokens come last
            return probs.gather(-1, draws), draws

        # children of the root come from the catch-up row; lists hold one [m] entry per depth
        if sampled and (noise is None or noise.shape[0] != 1 + plan.tree_visible.shape[0]):
            raise ValueError("a sampled static tree needs its noise [1 + tree rows, Vd] (Proposer.draft_noise)")
        root_probs = logits[None] if kernel else self.draft_dist(logits)[None]  # [1, Vd]
        batch_conf, batch_top = children(root_probs, noise[:1] if sampled else None)  # [rows expanded at d-1, R]
        tokens, logq = [root_tensor(root, self.device)], [batch_conf.new_zeros(1)]
        # sampled: the draw was inside q's support (greedy: unused, not built)
        alive = [torch.ones(1, dtype=torch.bool, device=self.device)] if sampled else []
        draft_probs = [self.to_target_probs(root_probs)] if sampled else []
        states = state[None]  # [1, H] states of the expanded nodes at the previous depth
        for d, level in enumerate(plan.levels, start=1):
            conf = batch_conf[level.slot, level.rank]  # [m]
            tokens.append(self.drafter.to_target_ids(batch_top[level.slot, level.rank]))
            logq.append(logq[-1][level.parent] + conf.clamp(min=1e-12).log())
            if sampled:
                alive.append(alive[-1][level.parent] & (conf > 0))
                draft_probs.append(root_probs.new_zeros(conf.shape[0], self.drafter.cfg.vocab_size))
            if level.expand is None:  # leaves only: the deepest level
                break
            out, states = rows.run(states[level.expand_slot], tokens[-1][level.expand], d, level.rows[0])
            probs = out if kernel else self.draft_dist(out)  # [e, Vd] ranked under the draft processors
            r0, e = level.rows  # the expanded nodes' tree rows r0..r0+e-1: noise rows 1+r0..r0+e
            batch_conf, batch_top = children(probs, noise[1 + r0: 1 + r0 + e] if sampled else None)
            if sampled:
                draft_probs[-1].index_copy_(0, level.expand, self.to_target_probs(probs))
        tree = DraftTree(tokens=torch.cat(tokens), parents=plan.parents, depths=plan.depths, logq=torch.cat(logq),
                         draft_probs=torch.cat(draft_probs) if sampled else None, ordered=True)
        return tree, torch.cat(alive) if sampled else None

    def _static_plan(self, sampled: bool) -> StaticPlan:
        """The plan of this spec's static tree, built once per (spec, sampled, device): a sampled round asks for
        both (its tree rows via the greedy plan, its growth via the sampled one), so one cached plan would be
        rebuilt twice per round (host->device copies)."""
        key = (self.spec, sampled, self.device)
        plans = self.__dict__.setdefault("_plans", {})
        if key not in plans:
            plans[key] = StaticPlan.build(static_layout(self.spec.static_choices()), sampled, self.device)
        return plans[key]


def draw_values(ranked: torch.Tensor, probs: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    """The values a sampled dynamic tree gives its draws [n, k]: the i-th draw gets the i-th largest q
    (`ranked`, q's sorted top-k), not its own q (`probs` gathered at `draws`). Valued by their own q, the budget
    would keep the likeliest draws instead of the first ones, and the acceptance would not be exact."""
    return ranked


class _Expansion:
    """The previous dynamic-tree expansion: output states [rows, H], first tree row, row count."""

    def __init__(self, out: torch.Tensor, row0: int, rows: int):
        self.out, self.row0, self.rows = out, row0, rows


@dataclass
class _Level:
    """The nodes of one depth d >= 1 of a static tree (node order = depth order: a contiguous range)."""

    slot: torch.Tensor  # [m] each node's parent's row in the batch expanded at depth d-1
    rank: torch.Tensor  # [m] the node's rank (greedy) or draw number (sampled) among its siblings
    parent: torch.Tensor  # [m] each node's parent's index among the nodes of depth d-1
    expand: torch.Tensor | None  # [e] indices (among depth d's nodes) of the nodes with children
    expand_slot: torch.Tensor | None  # [e] their parents' rows in the batch expanded at depth d-1
    rows: tuple[int, int]  # (first drafter tree row, e): the expanded nodes' rows


@dataclass
class StaticPlan:
    """Every index a static tree needs, as device tensors built once per (layout, sampled, device)."""

    parents: torch.Tensor  # [N]
    depths: torch.Tensor  # [N]
    n_ranks: int  # children ranked / drawn per expanded row
    levels: list[_Level]
    tree_visible: torch.Tensor  # [R, R] bool over the expanded nodes' drafter rows: ancestors and self

    @staticmethod
    def build(layout: StaticLayout, sampled: bool, device: torch.device) -> StaticPlan:
        def tensor(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long, device=device)

        parents, depths = layout.parents, layout.depths
        # greedy: the child's rank; sampled: its index among its siblings (= its draw number)
        ranks = _sibling_index(parents) if sampled else layout.ranks
        has_child = set(parents[1:])
        by_depth = [[i for i in range(len(parents)) if depths[i] == d] for d in range(max(depths) + 1)]
        local = {i: j for nodes in by_depth for j, i in enumerate(nodes)}  # index within its depth
        slot = {0: 0}  # expanded node -> its row in its depth's batch
        row_of: dict[int, int] = {}  # expanded node -> its drafter tree row
        levels = []
        for nodes in by_depth[1:]:
            expanded = [i for i in nodes if i in has_child]
            levels.append(_Level(
                slot=tensor([slot[parents[i]] for i in nodes]), rank=tensor([ranks[i] for i in nodes]),
                parent=tensor([local[parents[i]] for i in nodes]),
                expand=tensor([local[i] for i in expanded]) if expanded else None,
                expand_slot=tensor([slot[parents[i]] for i in expanded]) if expanded else None,
                rows=(len(row_of), len(expanded))))
            for j, i in enumerate(expanded):
                slot[i] = j
                row_of[i] = len(row_of)
        visible = torch.zeros(len(row_of), len(row_of), dtype=torch.bool)
        for i, row in row_of.items():
            while i > 0:  # itself, then every ancestor (all expanded) but the root
                visible[row, row_of[i]] = True
                i = parents[i]
        return StaticPlan(parents=tensor(list(parents)), depths=tensor(list(depths)), n_ranks=max(ranks) + 1,
                           levels=levels, tree_visible=visible.to(device))


def _sibling_index(parents: tuple[int, ...]) -> list[int]:
    """Each node's index among its parent's children, in node order (root: -1)."""
    seen: dict[int, int] = {}
    out = [-1]
    for p in parents[1:]:
        out.append(seen.get(p, 0))
        seen[p] = out[-1] + 1
    return out
