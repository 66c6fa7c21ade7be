"""Triton kernels for a draft tree's growth (draft/proposer.py, tree/core.py) and a round's acceptance
(engine/round_graph.py): fewer, cheaper kernels per depth inside the whole-tree and round CUDA graphs.

    children(logits [n, Vd], k) -> (conf [n, k] fp32, tok [n, k] long, log conf [n, k] fp32) in TWO kernels:
        per chunk of _CHUNK logits (one program each) the softmax's max and sum and k rounds of argmax (ties
        to the lower id), then per row the merge of the chunks' sorted lists: conf = exp(x - max) / sum, log
        conf = log(max(conf, floor)) (+ the parent's value); with `out`, written straight into a dynamic
        tree's preallocated candidates (tree.core.CandidateBuffers), their parents too
    race_children(q [n, V], E, k) -> the same for a sampled tree: q's top-k values (a dynamic tree values its
        i-th draw by q's i-th largest) and the k draws without replacement, the exponential race's top-k of
        q / E, in draw order
    rank_top(v [M], k, desc) -> (values [k], indices [k] long): the first k of a stable sort of v, by ranks:
        rank(i) = #{j: v_j before v_i}, written at rank (rank_top_ids: + an offset)
    expand_rows(...) -> an expansion's inputs: the expanded nodes' states (their parents' drafter outputs),
        target ids (through d2t) and mask rows (their parents' OR-ed in)
    select_tree(...) -> the final tree from the chosen candidates (tree.core's assembly: tokens through d2t,
        parent nodes by a searchsorted, depths, log values, the closure flag) and, given the candidates'
        confidences, the growth's input checks: a greedy dynamic tree's [4] flags
    ancestry(parents, depth) -> a dynamic tree's [T, T] visibility (a row sees itself and its ancestors), each
        row walking up at most `depth` parents
    argmax_keys(logits [T, V]) -> the target's argmax as per-chunk keys [T, S] (value, then the lower id),
        which accept_path merges
    accept_path(...) -> a greedy round's acceptance: the deepest row whose root path matches the target's
        argmax, the bonus, the path's length and the rows' order (path first)
    sampled_accept_path(...) -> a sampled round's walk (verify.sampled_path: the first accepted child under
        each node, from the sibling tests' values and the coins), the path's length and order

Values: children's conf is the softmax's within fp32 rounding (another summation order and exp), not bitwise,
and its log values are tl.log's; exactly tied logits go to the lower id (torch.topk's tie order is
unspecified). Drafts are proposals the target checks: this can move which token is proposed at a near-tie,
never what is emitted. Every path that must build the same tree (the eager proposer, the whole-tree graph)
calls the same function on the same device. race_children's values and draws (q / E by IEEE division, as
torch's), rank_top, select_tree, ancestry and the acceptance kernels are exact (comparisons, gathers and
integer arithmetic). Rows wider than MAX_VOCAB, or more than MAX_K children, are the caller's to route to
torch (`fits`).
"""

from __future__ import annotations

import torch

from eaglespec.kernels import jit, pdl, pdl_kwargs, pow2

MAX_VOCAB = 262144  # children(): the widest draft vocab (its merge holds a head per chunk: vocab / chunk per row)
MAX_K = 32  # children(): the most children per row (the kernels unroll a loop per child)
MAX_ROWS = 512  # accept_path(): the most tree rows (one program holds a [rows, rows] tile)
_CHUNK = 256  # children() / race_children(): logits per program of their first kernel
_RANK_TILE = 64  # rank_top: at most this many rows per program, and columns per step
_ARGMAX_CHUNK = 2048  # argmax_keys: logits per program


def fits(vocab: int, k: int) -> bool:
    """Whether children() takes rows of `vocab` logits, k children each."""
    return 0 < k <= min(vocab, MAX_K) and vocab <= MAX_VOCAB


# -- plain-torch references (the code each kernel replaces) --------------------------------------------------
def children_ref(logits: torch.Tensor, k: int, floor: float, base: torch.Tensor | None = None,
                 out: tuple[torch.Tensor, ...] | None = None, parent: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """softmax(logits) in fp32, its top-k (values sorted descending, ids), and log(max(values, floor)), plus
    base [n] fp32 per row when given (a dynamic tree's children valued on their parents' values). `out`:
    (conf, tok, log conf, parents) [n, k] to write (and return the first three of): a dynamic tree's candidate
    rows (tree.core.CandidateBuffers.layer), parents = `parent` [n] (the rows' candidate ids) per row, or -1
    without one."""
    conf, tok = torch.softmax(logits, dim=-1, dtype=torch.float32).topk(k, dim=-1)
    res = conf, tok, _plus(base, conf.clamp(min=floor).log())
    if out is None:
        return res
    for dst, src in zip(out, res):
        dst.copy_(src)
    out[3].copy_(parent[:, None].expand(out[3].shape) if parent is not None else out[3].new_full(out[3].shape, -1))
    return out[0], out[1], out[2]


def _plus(base: torch.Tensor | None, logc: torch.Tensor) -> torch.Tensor:
    """base [n] + logc [n, k] (fp32, base first as the kernels add), or logc when base is None."""
    return logc if base is None else base[:, None] + logc


def race_children_ref(q: torch.Tensor, noise: torch.Tensor, k: int, floor: float, base: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A sampled tree's children: q [n, V] (the processed draft distribution), noise [n, V] Exp(1) -> (q's
    top-k values [n, k] fp32 descending, the k draws without replacement [n, k] long: the exponential race's
    top-k of q / noise, in draw order, log(max(values, floor)) [n, k], plus base [n] per row when given)."""
    conf = q.float().topk(k, dim=-1).values
    return conf, (q.float() / noise).topk(k, dim=-1).indices, _plus(base, conf.clamp(min=floor).log())


def rank_top_ref(v: torch.Tensor, k: int, descending: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The first k of v.sort(descending, stable=True): (values [k], indices [k])."""
    vals, idx = v.sort(descending=descending, stable=True)
    return vals[:k], idx[:k]


def rank_top_ids_ref(v: torch.Tensor, k: int, offset: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """rank_top_ref (descending) and the indices plus `offset` [k] (a dynamic tree's expanded candidate
    ids)."""
    vals, idx = rank_top_ref(v, k)
    return vals, idx, idx + offset


def expand_rows_ref(local: torch.Tensor, k: int, prev: torch.Tensor, newest: torch.Tensor, table: torch.Tensor | None,
                    mask: torch.Tensor, r0: int, p0: int, inherit: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """A dynamic tree's inputs of an expansion: the expanded nodes' states (their parents' drafter outputs)
    and target ids, and (inherit) their mask rows OR-ed with their parents' (MaskRows.inherit)."""
    slot = local // k if inherit else torch.zeros_like(local)  # [n] parent row in prev
    if inherit:
        mask[r0: r0 + local.shape[0]].bitwise_or_(mask[p0:].index_select(0, slot))
    tokens = newest[local]
    return prev[slot], tokens if table is None else table[tokens]


def select_tree_ref(root: torch.Tensor, chosen: torch.Tensor, parents: torch.Tensor, tokens: torch.Tensor,
                    depths: torch.Tensor, logv: torch.Tensor, table: torch.Tensor | None,
                    conf: torch.Tensor | None = None, max_mass: float = 1.0
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """tree.core's assembly of the selected tree: root [1], chosen [B] candidate ids ascending, the
    candidates' parents / tokens / depths / log values [M] -> (ids [3, B+1] long: the tree's tokens (target
    ids through `table`; the root's as given), parent nodes (-1 at the root) and depths; logq [B+1] fp32;
    flags [4] bool: the checks of tree.core._child_flags on `conf` (the candidates' confidences by parent, [R,
    C]: not finite or outside [0, 1], a duplicate token (never checked: False), a row's sum above `max_mass`;
    all False without conf), then not closed: a chosen node's parent is neither the root (-1) nor chosen)."""
    parent_ids = parents[chosen]
    nodes = torch.searchsorted(chosen, parent_ids, right=True)  # [B]: chosen[j] is node j + 1, the root node 0
    not_closed = (torch.cat([chosen.new_full((1,), -1), chosen])[nodes] != parent_ids).any()
    tok = tokens[chosen]
    ids = torch.stack([torch.cat([root, tok if table is None else table[tok]]),
                       torch.cat([chosen.new_full((1,), -1), nodes]),
                       torch.cat([chosen.new_zeros(1), depths[chosen]])])
    false = torch.zeros((), dtype=torch.bool, device=chosen.device)
    if conf is None:
        checks = [false, false, false]
    else:
        c = conf.float()
        checks = [(c.clamp(0, 1) != c).any(), false, (c.sum(-1) > max_mass).any()]
    return ids, torch.cat([logv.new_zeros(1), logv[chosen]]).float(), torch.stack([*checks, not_closed])


def key_argmax_ref(keys: torch.Tensor) -> torch.Tensor:
    """argmax_keys' keys [T, S] -> the rows' argmax ids [T] long (the id held by each row's largest key)."""
    return 0x7FFFFFFF - (keys.max(dim=-1).values & 0x7FFFFFFF)


# -- the Triton kernels (plain functions here; _load() jits them on first use) --------------------------------
# Annotations are not evaluated (from __future__ import annotations): this module imports without triton.
def _key(x, cols):
    """fp32 x [B] and ids [B] -> int64 keys ordered as (x, then the lower id): the float's bits made monotone
    as a signed int32 (negative floats: the magnitude bits flipped) in the high word, 2^31 - 1 - id in the
    low."""
    bits = x.to(tl.int32, bitcast=True)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return (ordered.to(tl.int64) << 32) | (0x7FFFFFFF - cols).to(tl.int64)


def _key_value(key):
    """The fp32 value a _key holds (its high word, made a float again)."""
    ordered = (key >> 32).to(tl.int32)
    return (ordered ^ ((ordered >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)


def _key_id(key):
    """The id a _key holds (its low word)."""
    return 0x7FFFFFFF - (key & 0x7FFFFFFF)


def _store_top_keys(key, out_ptr, K: tl.constexpr):
    """The K largest of the keys [B] (int64 min: padding), descending -> out[0:K]."""
    empty = -9223372036854775807 - 1
    for j in tl.static_range(K):
        best = tl.reduce(key, 0, _max)
        tl.store(out_ptr + j, best)
        key = tl.where(key == best, empty, key)


def _heads(key_ptr, row, S, K: tl.constexpr, SP: tl.constexpr):
    """The merge's start over a row's S sorted chunk lists (each chunk's K keys, from _store_top_keys): at
    [SP] (each list's first key's address), pos [SP] (their next positions: 0), head [SP] (their first keys;
    padding past S: int64 min), valid [SP] (a list is there) -> _pop_head's state."""
    s = tl.arange(0, SP)
    at = key_ptr + (row * S + s) * K
    valid = s < S
    head = tl.load(at, mask=valid, other=-9223372036854775807 - 1)
    return at, tl.full([SP], 0, tl.int32), head, valid


def _pop_head(head, at, pos, valid, K: tl.constexpr):
    """One step of merging sorted key lists (each chunk's K keys, descending, from _store_top_keys): heads
    [SP] (the lists' next keys), at [SP] (the lists' first key's address), pos [SP] (their next positions),
    valid [SP] (a list is there) -> (the largest head, the heads and positions with its list advanced). Keys
    are distinct (they hold the id); when only padding is left every list 'advances' and stays padding."""
    best = tl.reduce(head, 0, _max)
    take = (head == best) & valid
    pos += take.to(tl.int32)
    head = tl.where(take, tl.load(at + pos, mask=take & (pos < K), other=-9223372036854775807 - 1), head)
    return best, head, pos


def _chunk_cols(V, CHUNK: tl.constexpr):
    """A chunk kernel's program (row, s): its row (int64), chunk s, columns s*CHUNK + [0, CHUNK) and which are
    < V."""
    row = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    cols = s * CHUNK + tl.arange(0, CHUNK)
    return row, s, cols, cols < V


def _chunk_top_kernel(x_ptr, key_ptr, stat_ptr, x_row_stride, V, S, K: tl.constexpr, CHUNK: tl.constexpr,
                      USE_GDC: tl.constexpr = False):
    """Program (row, s) over x[row, s*CHUNK : (s+1)*CHUNK]: its max and sum(exp(x - max)) -> stat[row, s,
    0:2], and the keys of its K largest (by value, then lower id; padding: int64 min) -> key[row, s, :K]."""
    _dependents(USE_GDC)
    _wait(USE_GDC)
    row, s, cols, inside = _chunk_cols(V, CHUNK)
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=inside, other=float("-inf")).to(tl.float32)
    m = tl.reduce(x, 0, _max)
    total = tl.reduce(tl.where(inside, tl.exp(x - m), 0.0), 0, _add)
    tl.store(stat_ptr + (row * S + s) * 2, m)
    tl.store(stat_ptr + (row * S + s) * 2 + 1, total)
    empty = -9223372036854775807 - 1
    _store_top_keys(tl.where(inside, _key(x, cols), empty), key_ptr + (row * S + s) * K, K)


def _argmax_chunk_kernel(x_ptr, key_ptr, x_row_stride, V, S, CHUNK: tl.constexpr, USE_GDC: tl.constexpr = False):
    """Program (row, s) over x[row, s*CHUNK : (s+1)*CHUNK] -> key[row, s]: the key of its largest (by value,
    then the lower id; a NaN as torch.argmax takes it: above everything; padding int64 min)."""
    _dependents(USE_GDC)
    _wait(USE_GDC)
    row, s, cols, inside = _chunk_cols(V, CHUNK)
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=inside, other=0.0).to(tl.float32)
    x = tl.where(x != x, float("nan"), x)  # one NaN (sign bit clear): every NaN above +inf
    empty = -9223372036854775807 - 1
    tl.store(key_ptr + row * S + s, tl.reduce(tl.where(inside, _key(x, cols), empty), 0, _max))


def _merge_top_kernel(key_ptr, stat_ptr, conf_ptr, tok_ptr, logc_ptr, base_ptr, par_ptr, parent_ptr, S, floor,
                      K: tl.constexpr, KB: tl.constexpr, SP: tl.constexpr, BASE: tl.constexpr,
                      PARENTS: tl.constexpr, USE_GDC: tl.constexpr = False):
    """Program row: the softmax statistics of its S chunks combined, then the K largest of its chunk keys ->
    conf = exp(x - max) / sum, the id, log(max(conf, floor)) (BASE: plus base[row]); PARENTS 1: par[row, :] =
    -1, 2: par[row, :] = parent[row] (0: nothing); KB = K rounded up to a power of 2. Each chunk's K keys are
    sorted (descending): the row's j-th largest is the largest of the chunks' heads, so K steps over S heads,
    not over all S*K keys."""
    _dependents(USE_GDC)
    _wait(USE_GDC)
    row = tl.program_id(0).to(tl.int64)
    base = tl.load(base_ptr + row) if BASE else 0.0
    if PARENTS != 0:
        j = tl.arange(0, KB)
        if PARENTS == 2:
            parent = tl.load(parent_ptr + row)
        else:
            parent = row * 0 - 1
        tl.store(par_ptr + row * K + j, tl.full([KB], 0, tl.int64) + parent, mask=j < K)
    at, pos, head, valid = _heads(key_ptr, row, S, K, SP)
    s = tl.arange(0, SP)
    m_s = tl.load(stat_ptr + (row * S + s) * 2, mask=valid, other=float("-inf"))
    t_s = tl.load(stat_ptr + (row * S + s) * 2 + 1, mask=valid, other=0.0)
    m = tl.reduce(m_s, 0, _max)
    # a chunk of -inf only (its sum NaN) adds nothing; a row of -inf only gives NaN, as softmax does
    total = tl.reduce(tl.where(m_s > float("-inf"), t_s * tl.exp(m_s - m), 0.0), 0, _add)
    for j in tl.static_range(K):
        best, head, pos = _pop_head(head, at, pos, valid, K)
        conf = tl.exp(_key_value(best) - m) / total
        tl.store(conf_ptr + row * K + j, conf)
        tl.store(tok_ptr + row * K + j, _key_id(best))
        logc = tl.log(tl.maximum(conf, floor))
        tl.store(logc_ptr + row * K + j, base + logc if BASE else logc)


def _race_chunk_kernel(q_ptr, e_ptr, vkey_ptr, rkey_ptr, q_row_stride, e_row_stride, V, S, K: tl.constexpr,
                       CHUNK: tl.constexpr, USE_GDC: tl.constexpr = False):
    """Program (row, s) over q[row, s*CHUNK : (s+1)*CHUNK]: the keys of its K largest q -> vkey[row, s, :K],
    and of its K largest q / e (IEEE division, as torch's) -> rkey[row, s, :K] (by value, then lower id;
    padding: int64 min)."""
    _dependents(USE_GDC)
    _wait(USE_GDC)
    row, s, cols, inside = _chunk_cols(V, CHUNK)
    q = tl.load(q_ptr + row * q_row_stride + cols, mask=inside, other=0.0).to(tl.float32)
    e = tl.load(e_ptr + row * e_row_stride + cols, mask=inside, other=1.0).to(tl.float32)
    empty = -9223372036854775807 - 1
    _store_top_keys(tl.where(inside, _key(q, cols), empty), vkey_ptr + (row * S + s) * K, K)
    _store_top_keys(tl.where(inside, _key(tl.math.div_rn(q, e), cols), empty), rkey_ptr + (row * S + s) * K, K)


def _race_merge_kernel(vkey_ptr, rkey_ptr, conf_ptr, tok_ptr, logc_ptr, base_ptr, S, floor, K: tl.constexpr,
                       SP: tl.constexpr, BASE: tl.constexpr, USE_GDC: tl.constexpr = False):
    """Program row: the K largest of its chunk keys of each kind (merged over the chunks' sorted lists,
    _pop_head) -> conf = the value, log(max(conf, floor)) (BASE: plus base[row]); tok = the race's ids, in
    order."""
    _dependents(USE_GDC)
    _wait(USE_GDC)
    row = tl.program_id(0).to(tl.int64)
    base = tl.load(base_ptr + row) if BASE else 0.0
    vat, vpos, vhead, valid = _heads(vkey_ptr, row, S, K, SP)
    rat, rpos, rhead, valid = _heads(rkey_ptr, row, S, K, SP)
    for j in tl.static_range(K):
        best, vhead, vpos = _pop_head(vhead, vat, vpos, valid, K)
        conf = _key_value(best)
        tl.store(conf_ptr + row * K + j, conf)
        logc = tl.log(tl.maximum(conf, floor))
        tl.store(logc_ptr + row * K + j, base + logc if BASE else logc)
        best, rhead, rpos = _pop_head(rhead, rat, rpos, valid, K)
        tl.store(tok_ptr + row * K + j, _key_id(best))


def _rank_top_kernel(v_ptr, vals_ptr, idx_ptr, ids_ptr, M, K, offset, DESC: tl.constexpr, IDS: tl.constexpr,
                     TILE: tl.constexpr, USE_GDC: tl.constexpr = False):
    """Program p ranks v[p*TILE : (p+1)*TILE] against all of v; rank < K is written at its rank (IDS: also the
    index plus offset)."""
    _dependents(USE_GDC)
    _wait(USE_GDC)
    i = tl.program_id(0) * TILE + tl.arange(0, TILE)
    in_i = i < M
    vi = tl.load(v_ptr + i, mask=in_i, other=0)
    rank = tl.full([TILE], 0, tl.int32)  # tl.full: a builtin (tl.zeros is jitted at import: see _load)
    for j0 in range(0, M, TILE):
        j = j0 + tl.arange(0, TILE)
        vj = tl.load(v_ptr + j, mask=j < M, other=0)
        if DESC:
            ahead = vj[None, :] > vi[:, None]
        else:
            ahead = vj[None, :] < vi[:, None]
        ahead = ahead | ((vj[None, :] == vi[:, None]) & (j[None, :] < i[:, None]))
        ahead = ahead & (j < M)[None, :]
        rank += tl.reduce(ahead.to(tl.int32), 1, _add)
    keep = in_i & (rank < K)
    tl.store(vals_ptr + rank, vi, mask=keep)
    tl.store(idx_ptr + rank, i.to(tl.int64), mask=keep)
    if IDS:
        tl.store(ids_ptr + rank, i.to(tl.int64) + offset, mask=keep)


def _expand_rows_kernel(local_ptr, prev_ptr, newest_ptr, table_ptr, states_ptr, tokens_ptr, mask_ptr, prev_stride,
                        mask_stride, k, r0, p0, H, X, INHERIT: tl.constexpr, MAP: tl.constexpr, HB: tl.constexpr,
                        XB: tl.constexpr, USE_GDC: tl.constexpr = False):
    """Program i: expanded node local[i] -> states[i] = prev[its parent slot], tokens[i] = (table of)
    newest[local[i]], and (INHERIT) mask row r0 + i |= mask row p0 + slot (a parent's row precedes its
    children's: no overlap)."""
    _dependents(USE_GDC)
    _wait(USE_GDC)
    i = tl.program_id(0)
    node = tl.load(local_ptr + i)
    if INHERIT:
        slot = node // k
    else:
        slot = node * 0
    h = tl.arange(0, HB)
    tl.store(states_ptr + i * H + h, tl.load(prev_ptr + slot * prev_stride + h, mask=h < H), mask=h < H)
    tok = tl.load(newest_ptr + node)
    if MAP:
        tok = tl.load(table_ptr + tok)
    tl.store(tokens_ptr + i, tok)
    if INHERIT:
        for x0 in range(0, X, XB):
            x = x0 + tl.arange(0, XB)
            parent = tl.load(mask_ptr + (p0 + slot) * mask_stride + x, mask=x < X)
            child = tl.load(mask_ptr + (r0 + i) * mask_stride + x, mask=x < X)
            tl.store(mask_ptr + (r0 + i) * mask_stride + x, child | parent, mask=x < X)


def _select_tree_kernel(root_ptr, chosen_ptr, parents_ptr, tokens_ptr, depths_ptr, logv_ptr, table_ptr, conf_ptr,
                        ids_ptr, logq_ptr, flag_ptr, B, R, C, max_mass, MAP: tl.constexpr, CONF: tl.constexpr,
                        BB: tl.constexpr, RB: tl.constexpr, CB: tl.constexpr, USE_GDC: tl.constexpr = False):
    """One program: node 1 + j is candidate chosen[j]; its parent node = #{i: chosen[i] <= its parent id} (a
    searchsorted over the ascending ids), and the selection is closed iff every parent id is -1 or chosen.
    CONF: the checks of the confidences conf [R, C] (RB rows at a time) -> flag[0] (one not >= 0 and <= 1: NaN
    compares false) and flag[2] (a row's sum above max_mass: a NaN sum compares false, as torch's); flag[1] (a
    duplicate token) is never checked."""
    _dependents(USE_GDC)
    _wait(USE_GDC)
    bad = tl.full([RB], 0, tl.int32)
    heavy = tl.full([RB], 0, tl.int32)
    if CONF:
        col = tl.arange(0, CB)
        for r0 in range(0, R, RB):
            r = r0 + tl.arange(0, RB)
            live = (r < R)[:, None] & (col < C)[None, :]
            x = tl.load(conf_ptr + r[:, None] * C + col[None, :], mask=live, other=0.0).to(tl.float32)
            ok = (x >= 0.0) & (x <= 1.0)
            bad = tl.maximum(bad, tl.reduce((live & (ok == 0)).to(tl.int32), 1, _max))
            heavy = tl.maximum(heavy, (tl.reduce(x, 1, _add) > max_mass).to(tl.int32))
    tl.store(flag_ptr, tl.reduce(bad, 0, _max).to(tl.uint8))
    tl.store(flag_ptr + 1, 0)
    tl.store(flag_ptr + 2, tl.reduce(heavy, 0, _max).to(tl.uint8))
    j = tl.arange(0, BB)
    inside = j < B
    c = tl.load(chosen_ptr + j, mask=inside, other=0)
    p = tl.load(parents_ptr + c, mask=inside, other=-1)  # [BB] parent candidate ids
    others = inside[None, :]
    node = tl.reduce(((c[None, :] <= p[:, None]) & others).to(tl.int64), 1, _add)
    found = tl.reduce(((c[None, :] == p[:, None]) & others).to(tl.int32), 1, _add) > 0
    open_ = inside & (p != -1) & (found == 0)
    tl.store(flag_ptr + 3, tl.reduce(open_.to(tl.int32), 0, _max).to(tl.uint8))
    tok = tl.load(tokens_ptr + c, mask=inside, other=0)
    if MAP:
        tok = tl.load(table_ptr + tok, mask=inside, other=0)
    n = B + 1
    tl.store(ids_ptr + 1 + j, tok, mask=inside)
    tl.store(ids_ptr + n + 1 + j, node, mask=inside)
    tl.store(ids_ptr + 2 * n + 1 + j, tl.load(depths_ptr + c, mask=inside, other=0), mask=inside)
    tl.store(logq_ptr + 1 + j, tl.load(logv_ptr + c, mask=inside, other=0.0).to(tl.float32), mask=inside)
    tl.store(ids_ptr, tl.load(root_ptr))
    tl.store(ids_ptr + n, -1)
    tl.store(ids_ptr + 2 * n, 0)
    tl.store(logq_ptr, 0.0)


def _ancestry_kernel(par_ptr, vis_ptr, T, DEPTH: tl.constexpr, RB: tl.constexpr, TB: tl.constexpr,
                     USE_GDC: tl.constexpr = False):
    """Rows RB * program .. of the [T, T] visibility: each row sets its own column, then walks up DEPTH
    parents (a parent of -1 ends the walk: masked loads keep it at -1) and sets each one's column."""
    _dependents(USE_GDC)
    _wait(USE_GDC)
    rows = tl.program_id(0) * RB + tl.arange(0, RB)
    cols = tl.arange(0, TB)
    live = rows < T
    reach = rows[:, None] == cols[None, :]
    node = rows.to(tl.int64)
    for _ in range(DEPTH):
        node = tl.load(par_ptr + tl.maximum(node, 0), mask=live & (node >= 0), other=-1)
        reach = reach | (node[:, None] == cols[None, :])
    tl.store(vis_ptr + rows[:, None] * T + cols[None, :], reach.to(tl.uint8), mask=live[:, None] & (cols[None, :] < T))


def _store_path(ok, dep, i, inside, vis_ptr, best_ptr, m_ptr, order_ptr, T, P, TB: tl.constexpr):
    """The two acceptance kernels' end: best = the first deepest ok row (stored, and returned); its ancestry
    row is the path, whose length m is stored and whose rows go first in `order` (in row order), then the
    others."""
    score = tl.where(ok, dep, -1)
    top = tl.reduce(score, 0, _max)
    best = tl.reduce(tl.where(inside & (score == top), i, TB), 0, _min)
    tl.store(best_ptr, best.to(tl.int64))
    on = inside & (tl.load(vis_ptr + best * T + i, mask=inside, other=0) != 0)
    m = tl.reduce(on.to(tl.int64), 0, _add)
    tl.store(m_ptr, m)
    on_before = tl.reduce(((i[None, :] < i[:, None]) & on[None, :]).to(tl.int64), 1, _add)  # [TB]
    pos = tl.where(on, on_before, m + i - on_before)
    tl.store(order_ptr + pos, i.to(tl.int64), mask=inside & (pos < P))
    return best


def _next_ids(next_ptr, rows, inside, S, KEYS: tl.constexpr, SB: tl.constexpr):
    """The target's argmax at `rows` [TB]: next[rows], or (KEYS) the id of the largest of keys[rows, :S]
    (argmax_keys)."""
    if KEYS:
        s = tl.arange(0, SB)
        empty = -9223372036854775807 - 1
        keys = tl.load(next_ptr + rows[:, None] * S + s[None, :], mask=inside[:, None] & (s < S)[None, :], other=empty)
        return _key_id(tl.reduce(keys, 1, _max))
    return tl.load(next_ptr + rows, mask=inside, other=0)


def _accept_path_kernel(tok_ptr, par_ptr, dep_ptr, vis_ptr, next_ptr, best_ptr, bonus_ptr, m_ptr, order_ptr, T, P, S,
                        TB: tl.constexpr, KEYS: tl.constexpr, SB: tl.constexpr, USE_GDC: tl.constexpr = False):
    """One program over the T tree rows: a row is ok when every visible row matches (its token is the target's
    argmax at its parent row, or it is the root); best = the first deepest ok row; its ancestry row is the
    path, whose rows go first in `order` (in row order), then the others (in row order). The argmax: next [T],
    or (KEYS) from argmax_keys' keys [T, S]."""
    _dependents(USE_GDC)
    _wait(USE_GDC)
    i = tl.arange(0, TB)
    inside = i < T
    tok = tl.load(tok_ptr + i, mask=inside, other=0)
    par = tl.load(par_ptr + i, mask=inside, other=0)
    dep = tl.load(dep_ptr + i, mask=inside, other=0)
    want = _next_ids(next_ptr, tl.maximum(par, 0), inside, S, KEYS, SB)
    match = (tok == want) | (par < 0)
    both = inside[:, None] & inside[None, :]
    vis = tl.load(vis_ptr + i[:, None] * T + i[None, :], mask=both, other=0)
    bad = ((vis != 0) & (match == 0)[None, :]).to(tl.int32)
    ok = inside & (tl.reduce(bad, 1, _max) == 0)
    best = _store_path(ok, dep, i, inside, vis_ptr, best_ptr, m_ptr, order_ptr, T, P, TB)
    bonus = _next_ids(next_ptr, best + i * 0, i == 0, S, KEYS, SB)  # [TB]: the bonus at lane 0
    tl.store(bonus_ptr + i, bonus, mask=i == 0)


def _sampled_accept_path_kernel(par_ptr, kids_ptr, live_ptr, r_ptr, q_ptr, coin_ptr, vis_ptr, dep_ptr, best_ptr,
                                m_ptr, order_ptr, T, K, P, TB: tl.constexpr, KB: tl.constexpr,
                                USE_GDC: tl.constexpr = False):
    """One program over the T tree rows: node c passes its test when coin_c * q_c < r_c, and is its parent's
    first accepted child when it passes, takes part (live) and no sibling of a lower rank (its place in the
    parent's kids row) takes part and passes; a row is ok when every visible row is such a child (or the
    root); then best, the path's length and the rows' order as _accept_path_kernel's."""
    _dependents(USE_GDC)
    _wait(USE_GDC)
    i = tl.arange(0, TB)
    inside = i < T
    k = tl.arange(0, KB)
    par = tl.load(par_ptr + i, mask=inside, other=-1)
    cells = inside[:, None] & (k < K)[None, :]  # [TB, KB]: each node's parent's kids row
    at = tl.maximum(par, 0)[:, None] * K + k[None, :]
    sib = tl.load(kids_ptr + at, mask=cells, other=0)
    takes = cells & (tl.load(live_ptr + at, mask=cells, other=0) != 0)
    coin = tl.load(coin_ptr + sib, mask=takes, other=1.0)
    q = tl.load(q_ptr + sib, mask=takes, other=1.0)
    r = tl.load(r_ptr + sib, mask=takes, other=0.0)
    hit = takes & (coin * q < r)  # [TB, KB]: the sibling takes part and passes
    me = cells & (sib == i[:, None])  # the node's own cell (node 0, the root, is no one's child)
    rank = tl.reduce(tl.where(me, k[None, :], KB), 1, _min)  # [TB]
    earlier = tl.reduce((hit & (k[None, :] < rank[:, None])).to(tl.int32), 1, _max)
    mine = tl.reduce((hit & me).to(tl.int32), 1, _max)
    first = ((mine != 0) & (earlier == 0) & (par >= 0)) | (i == 0)
    both = inside[:, None] & inside[None, :]
    vis = tl.load(vis_ptr + i[:, None] * T + i[None, :], mask=both, other=0)
    bad = ((vis != 0) & (first == 0)[None, :]).to(tl.int32)
    ok = inside & (tl.reduce(bad, 1, _max) == 0)
    _store_path(ok, tl.load(dep_ptr + i, mask=inside, other=0), i, inside, vis_ptr, best_ptr, m_ptr, order_ptr, T, P,
                TB)


_JITTED = ("_key", "_key_value", "_key_id", "_store_top_keys", "_heads", "_pop_head", "_chunk_cols",
           "_chunk_top_kernel", "_argmax_chunk_kernel", "_merge_top_kernel", "_race_chunk_kernel",
           "_race_merge_kernel", "_rank_top_kernel", "_expand_rows_kernel", "_select_tree_kernel", "_store_path",
           "_next_ids", "_accept_path_kernel", "_sampled_accept_path_kernel", "_ancestry_kernel")


def _load() -> None:
    """Jit the kernels above (eaglespec.kernels.jit also puts triton, tl and the shared helpers here)."""
    global triton, tl, _add, _max, _min, _dependents, _wait
    jit(globals(), _JITTED)


# -- the launchers -----------------------------------------------------------------------------------------
def children(logits: torch.Tensor, k: int, floor: float, base: torch.Tensor | None = None,
             out: tuple[torch.Tensor, ...] | None = None, parent: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """children_ref in two kernels: logits [n, V] (V <= MAX_VOCAB, k <= V) -> conf [n, k] fp32 descending, tok
    [n, k] long, log conf [n, k] fp32. The first kernel takes each row in chunks of _CHUNK, one program each
    (its softmax statistics and top-k keys), the second merges a row's chunks (one program per row). `out`
    (conf, tok, log conf, parents: contiguous [n, k] views of a dynamic tree's preallocated candidates) is
    written by the merge, the parents column too (`parent` [n] long, or -1): the growth joins no layers."""
    _load()
    n, v = logits.shape
    if not fits(v, k):
        raise ValueError(f"tree kernels: top-{k} of rows of {v} (at most top-{MAX_K} of {MAX_VOCAB})")
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    dev = logits.device
    chunk = _chunk_len(v)
    splits = -(-v // chunk)
    keys = torch.empty(n, splits, k, dtype=torch.long, device=dev)
    stats = torch.empty(n, splits, 2, dtype=torch.float32, device=dev)
    if out is None:
        conf = torch.empty(n, k, dtype=torch.float32, device=dev)
        tok = torch.empty(n, k, dtype=torch.long, device=dev)
        logc = torch.empty(n, k, dtype=torch.float32, device=dev)
        par, parents = tok, 0  # the parents column and what the merge writes there: 0 nothing, 1 -1, 2 parent[row]
    else:
        dtypes = (torch.float32, torch.long, torch.float32, torch.long)
        if len(out) != 4 or any(x.shape != (n, k) or not x.is_contiguous() or x.dtype != t for x, t in zip(out, dtypes)):
            raise ValueError(f"tree kernels: children's out must be 4 contiguous [{n}, {k}] tensors: conf fp32, tokens "
                             "long, log conf fp32, parents long")
        conf, tok, logc, par = out
        parents = 1
    g = pdl(logits)
    _chunk_top_kernel[(n, splits)](logits, keys, stats, logits.stride(0), v, splits, K=k, CHUNK=chunk,
                                   num_warps=_chunk_warps(chunk), **pdl_kwargs(g))
    if parent is not None:
        if out is None or parent.shape != (n,) or parent.dtype != torch.long:
            raise ValueError(f"tree kernels: children's parent must be [{n}] long, with out")
        parent, parents = parent.contiguous(), 2
    _merge_top_kernel[(n,)](keys, stats, conf, tok, logc, _base(base, n, logc), par,
                            parent if parent is not None else par, splits, floor, K=k, KB=pow2(k),
                            SP=pow2(splits), BASE=base is not None, PARENTS=parents,
                            num_warps=1, **pdl_kwargs(g))  # one warp: a head per chunk (47 at 12,000 ids)
    return conf, tok, logc


def _chunk_len(v: int) -> int:
    """The top-k kernels' chunk for rows of v: _CHUNK, at most v rounded up to a power of two."""
    return min(_CHUNK, pow2(v))


def _chunk_warps(chunk: int) -> int:
    """Warps for a chunk kernel's program: one per 256 logits, 1 to 4 (a chunk of 256 reduces within one warp,
    with no barrier)."""
    return max(1, min(4, chunk // 256))


def race_children(q: torch.Tensor, noise: torch.Tensor, k: int, floor: float, base: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """race_children_ref in two kernels (as children): q, noise [n, V] (V <= MAX_VOCAB, k <= V) -> conf [n, k]
    fp32 descending, tok [n, k] long, log conf [n, k] fp32. The values are exact (comparisons and torch's
    division); among exactly tied keys the lower id wins (torch.topk's order there is unspecified)."""
    _load()
    n, v = q.shape
    if not fits(v, k) or noise.shape != q.shape:
        raise ValueError(f"tree kernels: a race of top-{k} over {tuple(q.shape)} and noise {tuple(noise.shape)}")
    q = q if q.stride(-1) == 1 else q.contiguous()
    noise = noise if noise.stride(-1) == 1 else noise.contiguous()
    dev = q.device
    chunk = _chunk_len(v)
    splits = -(-v // chunk)
    vkeys = torch.empty(n, splits, k, dtype=torch.long, device=dev)
    rkeys = torch.empty(n, splits, k, dtype=torch.long, device=dev)
    conf = torch.empty(n, k, dtype=torch.float32, device=dev)
    tok = torch.empty(n, k, dtype=torch.long, device=dev)
    logc = torch.empty(n, k, dtype=torch.float32, device=dev)
    g = pdl(q)
    _race_chunk_kernel[(n, splits)](q, noise, vkeys, rkeys, q.stride(0), noise.stride(0), v, splits, K=k, CHUNK=chunk,
                                    num_warps=_chunk_warps(chunk), **pdl_kwargs(g))
    _race_merge_kernel[(n,)](vkeys, rkeys, conf, tok, logc, _base(base, n, logc), splits, floor, K=k,
                             SP=pow2(splits), BASE=base is not None, num_warps=1,
                             **pdl_kwargs(g))  # one warp: a head per chunk
    return conf, tok, logc


def _base(base: torch.Tensor | None, n: int, like: torch.Tensor) -> torch.Tensor:
    """children's / race_children's base [n] fp32 (contiguous), or any fp32 tensor when None (not read)."""
    if base is None:
        return like
    if base.shape != (n,) or base.dtype != torch.float32:
        raise ValueError(f"tree kernels: a base of {tuple(base.shape)} {base.dtype} for {n} rows (fp32 [n])")
    return base.contiguous()


def _rank(v: torch.Tensor, k: int, descending: bool, offset: int | None
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The ranking kernel's launch: (values [k], indices [k], the indices plus offset [k], or None without
    one)."""
    _load()
    m = v.numel()
    if v.dim() != 1 or not 0 < k <= m:
        raise ValueError(f"tree kernels: the first {k} of {tuple(v.shape)}")
    v = v.contiguous()
    vals = torch.empty(k, dtype=v.dtype, device=v.device)
    idx = torch.empty(k, dtype=torch.long, device=v.device)
    ids = None if offset is None else torch.empty(k, dtype=torch.long, device=v.device)
    tile = min(_RANK_TILE, max(16, pow2(m)))
    g = pdl(v)
    _rank_top_kernel[(triton.cdiv(m, tile),)](v, vals, idx, idx if ids is None else ids, m, k, offset or 0,
                                              DESC=descending, IDS=ids is not None, TILE=tile, **pdl_kwargs(g))
    return vals, idx, ids


def rank_top(v: torch.Tensor, k: int, descending: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """rank_top_ref in one kernel: v [M] (any real dtype, contiguous), 0 < k <= M -> (values [k], indices
    [k])."""
    vals, idx, _ = _rank(v, k, descending, None)
    return vals, idx


def rank_top_ids(v: torch.Tensor, k: int, offset: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """rank_top_ids_ref in one kernel (rank_top's, also writing the indices plus offset)."""
    return _rank(v, k, True, offset)


def expand_rows(local: torch.Tensor, k: int, prev: torch.Tensor, newest: torch.Tensor, table: torch.Tensor | None,
                mask: torch.Tensor, r0: int, p0: int, inherit: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """expand_rows_ref in one kernel: local [n] long (the expanded nodes' indices in the newest layer, whose
    parent is prev row local // k; row 0 when not `inherit`: the root's children), prev [m, H] (last dim
    contiguous), newest [M] long (the newest layer's draft ids), table [Vd] long or None (draft -> target
    ids), mask [R, X] bool (contiguous rows; written in place when `inherit`) -> (states [n, H], target ids
    [n])."""
    _load()
    n, h = local.shape[0], prev.shape[1]
    if prev.stride(-1) != 1 or mask.stride(-1) != 1 or mask.dtype != torch.bool:
        raise ValueError("tree kernels: expand_rows needs prev and a bool mask with contiguous rows")
    states = torch.empty(n, h, dtype=prev.dtype, device=prev.device)
    tokens = torch.empty(n, dtype=torch.long, device=prev.device)
    x = mask.shape[1]
    g = pdl(prev)
    _expand_rows_kernel[(n,)](local, prev, newest, table if table is not None else newest, states, tokens,
                              mask.view(torch.uint8), prev.stride(0), mask.stride(0), k, r0, p0, h, x,
                              INHERIT=inherit, MAP=table is not None, HB=pow2(h),
                              XB=min(1024, pow2(x)), num_warps=4, **pdl_kwargs(g))
    return states, tokens


def select_tree(root: torch.Tensor, chosen: torch.Tensor, parents: torch.Tensor, tokens: torch.Tensor,
                depths: torch.Tensor, logv: torch.Tensor, table: torch.Tensor | None,
                conf: torch.Tensor | None = None, max_mass: float = 1.0
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """select_tree_ref in one kernel (root [1] long, chosen [B >= 1] long ascending, the candidate fields [M]
    contiguous: parents / tokens / depths long, logv float; conf [R, C] float or None). The confidences'
    checks ride along (a few hundred values in the one program) in place of tree.core._child_flags' ops and
    the flags' stack."""
    _load()
    b = chosen.numel()
    if b < 1 or root.numel() != 1 or (conf is not None and conf.dim() != 2):
        raise ValueError(f"tree kernels: select_tree of {b} chosen nodes, root {tuple(root.shape)}, conf "
                         f"{None if conf is None else tuple(conf.shape)}")
    dev = chosen.device
    ids = torch.empty(3, b + 1, dtype=torch.long, device=dev)
    logq = torch.empty(b + 1, dtype=torch.float32, device=dev)
    flags = torch.empty(4, dtype=torch.bool, device=dev)
    r, c = conf.shape if conf is not None else (0, 0)
    g = pdl(chosen)
    _select_tree_kernel[(1,)](root, chosen, parents.contiguous(), tokens.contiguous(), depths.contiguous(),
                              logv.contiguous(), table if table is not None else tokens,
                              conf.contiguous() if conf is not None else logq, ids, logq, flags.view(torch.uint8), b,
                              r, c, max_mass, MAP=table is not None, CONF=conf is not None, BB=max(16, pow2(b)),
                              RB=16, CB=max(2, pow2(c)), num_warps=4, **pdl_kwargs(g))
    return ids, logq, flags


def argmax_keys(logits: torch.Tensor) -> torch.Tensor:
    """logits [T, V] -> keys [T, S] int64 (one kernel, a program per row and chunk of _ARGMAX_CHUNK): each
    chunk's largest as a _key (value, then the lower id), for accept_path, which takes each row's largest
    key's id: the row's torch.argmax (the first of tied maxima; a NaN above everything). key_argmax_ref reads
    them on the host side."""
    _load()
    t, v = logits.shape
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    chunk = min(_ARGMAX_CHUNK, pow2(v))
    splits = -(-v // chunk)
    keys = torch.empty(t, splits, dtype=torch.long, device=logits.device)
    g = pdl(logits)
    _argmax_chunk_kernel[(t, splits)](logits, keys, logits.stride(0), v, splits, CHUNK=chunk, num_warps=4,
                                      **pdl_kwargs(g))
    return keys


def accept_path(tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor, visible: torch.Tensor,
                target_next: torch.Tensor, p: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A greedy round's acceptance (verify.matching_path_end, then the path's rows) in one kernel: tree tokens
    / parents / depths [T] long, ancestry visible [T, T] bool, target_next the target's argmax at every row
    [T] long or argmax_keys' keys [T, S] (the argmax merged here) -> (best [1]: the deepest row whose root
    path matches, the bonus [1] after it, m []: the path's rows, order [min(T, p)]: the path's rows in depth
    order, then the other rows in order)."""
    _load()
    t = tokens.numel()
    if visible.shape != (t, t) or visible.dtype != torch.bool or not 0 < t <= MAX_ROWS:
        raise ValueError(f"tree kernels: accept_path over {t} rows (at most {MAX_ROWS}), visible "
                         f"{tuple(visible.shape)} {visible.dtype}")
    if target_next.dim() not in (1, 2) or target_next.shape[0] != t or target_next.dtype != torch.long:
        raise ValueError(f"tree kernels: accept_path's target_next must be [{t}] or [{t}, S] long, not "
                         f"{tuple(target_next.shape)} {target_next.dtype}")
    splits = target_next.shape[1] if target_next.dim() == 2 else 1
    dev = tokens.device
    best = torch.empty(1, dtype=torch.long, device=dev)
    bonus = torch.empty(1, dtype=torch.long, device=dev)
    m = torch.empty((), dtype=torch.long, device=dev)
    order = torch.empty(min(t, p), dtype=torch.long, device=dev)
    g = pdl(tokens)
    _accept_path_kernel[(1,)](tokens.contiguous(), parents.contiguous(), depths.contiguous(),
                              visible.contiguous().view(torch.uint8), target_next.contiguous(), best, bonus, m,
                              order, t, min(t, p), splits, TB=max(16, pow2(t)), KEYS=target_next.dim() == 2,
                              SB=pow2(splits), num_warps=8, **pdl_kwargs(g))
    return best, bonus, m, order


def sampled_accept_path(parents: torch.Tensor, kids: torch.Tensor, live: torch.Tensor, r_at: torch.Tensor,
                        q_at: torch.Tensor, coins: torch.Tensor, visible: torch.Tensor, depths: torch.Tensor, p: int
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A sampled round's acceptance walk (verify.sampled_path, then the path's rows) in one kernel: parents /
    depths [T] long, kids [T, K] long and live [T, K] bool (the sibling table and its live children), the
    tests' r_at / q_at and the coins [T] fp32, visible [T, T] bool -> (best [1]: the deepest node of the
    accepted path, m []: the path's rows, order [min(T, p)]: the path's rows in depth order, then the other
    rows in order)."""
    _load()
    t, k = kids.shape
    if (visible.shape != (t, t) or visible.dtype != torch.bool or live.shape != (t, k) or live.dtype != torch.bool
            or not 0 < t <= MAX_ROWS or not 0 < k <= MAX_K):
        raise ValueError(f"tree kernels: sampled_accept_path over {t} rows (at most {MAX_ROWS}) and {k} kids (at "
                         f"most {MAX_K}), visible {tuple(visible.shape)} {visible.dtype}, live {tuple(live.shape)} "
                         f"{live.dtype}")
    dev = kids.device
    best = torch.empty(1, dtype=torch.long, device=dev)
    m = torch.empty((), dtype=torch.long, device=dev)
    order = torch.empty(min(t, p), dtype=torch.long, device=dev)
    f32 = [x.contiguous() if x.dtype == torch.float32 else x.float() for x in (r_at, q_at, coins)]
    g = pdl(kids)
    _sampled_accept_path_kernel[(1,)](parents.contiguous(), kids.contiguous(), live.contiguous().view(torch.uint8),
                                      *f32, visible.contiguous().view(torch.uint8), depths.contiguous(), best, m,
                                      order, t, k, min(t, p), TB=max(16, pow2(t)), KB=max(2, pow2(k)),
                                      num_warps=8, **pdl_kwargs(g))
    return best, m, order


def ancestry(parents: torch.Tensor, depth: int) -> torch.Tensor:
    """tree.core.ancestry(parents, check=False, max_depth=depth) in one kernel: parents [T] long (parents[i] <
    i, -1 at the root; no node deeper than `depth`) -> visible [T, T] bool, row i = i and its ancestors."""
    _load()
    t = parents.numel()
    if not 0 < t <= MAX_ROWS:
        raise ValueError(f"tree kernels: ancestry over {t} rows (at most {MAX_ROWS})")
    visible = torch.empty(t, t, dtype=torch.bool, device=parents.device)
    rb = 16
    g = pdl(parents)
    _ancestry_kernel[(triton.cdiv(t, rb),)](parents.contiguous(), visible.view(torch.uint8), t, DEPTH=max(depth, 1),
                                            RB=rb, TB=max(16, pow2(t)), **pdl_kwargs(g))
    return visible
