"""Programmatic dependent launch (eaglespec.kernels.pdl) under Triton's CPU interpreter (TRITON_INTERPRET=1, set by
conftest): on for sm90+ CUDA tensors only, off on CPU and under the interpreter (which cannot run griddepcontrol).
The tree, round-tail and sampled kernels take USE_GDC and wait first thing; the step, attention and skinny kernels
read only weights before their wait and store nothing (the source, parsed); every launch passes
**pdl_kwargs(pdl of one of its inputs) (the source, and the tree / round / sampled launchers run with the kernels
spied on); the results are the same with PDL asked for. PDL itself needs an sm90 GPU."""

from __future__ import annotations

import ast
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("triton")

from eaglespec import kernels
from eaglespec.kernels import attention as attn_kernels
from eaglespec.kernels import round_tail as RK
from eaglespec.kernels import sampled as SK
from eaglespec.kernels import skinny
from eaglespec.kernels import step as K
from eaglespec.kernels import tree as TK
from eaglespec.tree.core import CONF_FLOOR, ancestry
from eaglespec.verify import sibling_table_of, sibling_tests

MODULES = {TK: 11, RK: 1, SK: 3}  # module -> its kernels (and launch sites)
TARGET_MODULES = (K, attn_kernels, skinny)
# the target's kernels that load a weight before their wait: kernel -> the weight pointers (kernels.pdl's rule)
PREFETCHED = {"_rms_norm_weight_kernel": {"w_ptr"}, "_eagle3_input_kernel": {"in_w_ptr", "hid_w_ptr"},
              "_skinny_kernel": {"w_cols"}}


def _tree(module) -> ast.Module:
    with open(module.__file__) as f:
        return ast.parse(f.read())


def _kernels(module) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in _tree(module).body if isinstance(n, ast.FunctionDef) and n.name.endswith("_kernel")}


def _calls(node: ast.AST, name: str) -> list[ast.Call]:
    return [c for c in ast.walk(node) if isinstance(c, ast.Call) and ast.unparse(c.func) == name]


# -- where PDL is on --------------------------------------------------------------------------------------------
def test_pdl_is_on_for_sm90_cuda_tensors_only(monkeypatch):
    assert kernels.pdl(torch.zeros(3)) is False  # CPU / the interpreter: never (it cannot run gdc_wait)
    cuda = SimpleNamespace(is_cuda=True, device=torch.device("cuda", 0))  # a CUDA tensor's stand-in
    assert kernels.pdl(cuda) is False  # the interpreter is on
    monkeypatch.setattr(kernels, "interpreted", lambda: False)
    hopper = {"yes": True}
    monkeypatch.setattr(kernels, "_hopper_or_later", lambda index: hopper["yes"])
    assert kernels.pdl(cuda) is True
    hopper["yes"] = False
    assert kernels.pdl(cuda) is False  # before Hopper: no griddepcontrol


# -- the source: every kernel waits first, every launch passes the flags ---------------------------------------
@pytest.mark.parametrize("module", list(MODULES), ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_every_kernel_takes_use_gdc_and_waits_before_any_access(module):
    kernels = _kernels(module)
    assert len(kernels) == MODULES[module]
    assert set(kernels) == {n for n in module._JITTED if n.endswith("_kernel")}  # all of them are jitted
    for name, fn in kernels.items():
        last = fn.args.args[-1]
        assert last.arg == "USE_GDC" and ast.unparse(last.annotation) == "tl.constexpr", name
        assert isinstance(fn.args.defaults[-1], ast.Constant) and fn.args.defaults[-1].value is False, name
        body = fn.body[1:] if isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant) else fn.body
        # the first statements, unconditional: nothing read (all inputs are activations) or stored before the wait
        assert [ast.unparse(s) for s in body[:2]] == ["_dependents(USE_GDC)", "_wait(USE_GDC)"], name
        assert len(_calls(fn, "_wait")) == len(_calls(fn, "_dependents")) == 1, name
        wait = body[1].lineno
        access = _calls(fn, "tl.load") + _calls(fn, "tl.store")
        assert access and all(c.lineno > wait for c in access), name
    helpers = [n for n in _tree(module).body if isinstance(n, ast.FunctionDef) and n.name not in kernels]
    assert not any(_calls(h, "_wait") or _calls(h, "_dependents") for h in helpers)  # the kernels' business only


def test_pdl_kwargs_name_nothing_when_off_and_a_triton_without_pdl_never_gets_it(monkeypatch):
    assert kernels.pdl_kwargs(False) == {}  # an older Triton refuses launch_pdl even when False
    assert kernels.pdl_kwargs(True) == {"USE_GDC": True, "launch_pdl": True}
    from triton.language.extra import cuda

    monkeypatch.delattr(cuda, "gdc_wait")
    assert kernels._hopper_or_later.__wrapped__(0) is False  # no gdc_wait: no PDL, whatever the GPU


def _runs_before(body: list[ast.stmt], call: ast.Call) -> list[ast.stmt] | None:
    """The statements that run before `call` on its own path through `body` (the earlier statements of every block
    that encloses it, other branches left out), or None where body does not contain it."""
    for i, stmt in enumerate(body):
        if not any(node is call for node in ast.walk(stmt)):
            continue
        for inner in (getattr(stmt, "body", None), getattr(stmt, "orelse", None)):
            if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                found = _runs_before(inner, call)
                if found is not None:
                    return body[:i] + found
        return body[:i]
    return None


@pytest.mark.parametrize("module", TARGET_MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_target_kernels_read_only_weights_before_the_wait(module):
    kernels = _kernels(module)
    assert kernels
    helpers = {n.name: n for n in _tree(module).body if isinstance(n, ast.FunctionDef) and n.name not in kernels}
    accessing = {name for name, h in helpers.items() if _calls(h, "tl.load") or _calls(h, "tl.store")}
    for name, fn in kernels.items():
        assert "USE_GDC" in [a.arg for a in fn.args.args], name
        waits = _calls(fn, "_wait")
        assert waits and _calls(fn, "_dependents"), name
        for wait in waits:  # what runs before each wait on its path (a kernel may wait in each of two branches)
            before = _runs_before(fn.body, wait)
            assert before is not None, name
            assert not any(_calls(s, "tl.store") for s in before), f"{name}: a store before the wait"
            for helper in accessing:  # a helper that loads or stores is called after the wait only
                assert not any(_calls(s, helper) for s in before), f"{name}: {helper} before the wait"
            for load in (c for s in before for c in _calls(s, "tl.load")):
                names = {n.id for n in ast.walk(load.args[0]) if isinstance(n, ast.Name)}
                assert names & PREFETCHED.get(name, set()), f"{name} line {load.lineno}: loads {names} before the wait"


def test_the_before_the_wait_check_sees_each_branch():
    """_runs_before follows a wait into its branch: a load in the other branch is not before it; one before the if
    and one before the wait in the same branch are."""
    fn = ast.parse("def k(P):\n    a = tl.load(p)\n    if P:\n        b = tl.load(q)\n        _wait(1)\n"
                   "    else:\n        c = tl.load(r)\n        _wait(1)\n        d = tl.load(s)\n").body[0]
    first, second = _calls(fn, "_wait")

    def loads(call: ast.Call) -> set[str]:
        return {ast.unparse(c.args[0]) for s in _runs_before(fn.body, call) for c in _calls(s, "tl.load")}

    assert loads(first) == {"p", "q"} and loads(second) == {"p", "r"}


@pytest.mark.parametrize("module", [*MODULES, *TARGET_MODULES], ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_every_launch_passes_pdl_kwargs_of_pdl(module):
    """Each launch passes `**pdl_kwargs(v)`, v assigned from pdl(<a tensor>) in the launcher; no launch names
    USE_GDC or launch_pdl itself (a Triton without PDL refuses launch_pdl even when it is False)."""
    launched = []
    for fn in (n for n in _tree(module).body if isinstance(n, ast.FunctionDef)):
        switches = {a.targets[0].id for a in ast.walk(fn) if isinstance(a, ast.Assign) and len(a.targets) == 1
                    and isinstance(a.targets[0], ast.Name) and isinstance(a.value, ast.Call)
                    and ast.unparse(a.value.func) == "pdl" and len(a.value.args) == 1}
        for call in ast.walk(fn):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Subscript)
                    and ast.unparse(call.func.value).endswith("_kernel")):
                continue
            name = ast.unparse(call.func.value)
            named = {k.arg for k in call.keywords}
            spread = [k.value for k in call.keywords if k.arg is None and isinstance(k.value, ast.Call)
                      and ast.unparse(k.value.func) == "pdl_kwargs"]
            assert not named & {"USE_GDC", "launch_pdl"}, (fn.name, name)
            assert len(spread) == 1 and ast.unparse(spread[0].args[0]) in switches, (fn.name, name)
            launched.append(name)
    assert set(launched) == set(_kernels(module))
    with open(module.__file__) as f:
        assert "launch_pdl=" not in f.read()
    if module in MODULES:
        assert len(launched) == MODULES[module]


# -- the launchers: pdl's answer reaches every launch; it changes no result ------------------------------------
class _Spy:
    """A jitted kernel whose launches are logged (name, USE_GDC, launch_pdl), then run without PDL."""

    def __init__(self, kernel, name: str, log: list):
        self.kernel, self.name, self.log = kernel, name, log

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.log.append((self.name, kw.get("USE_GDC"), kw.get("launch_pdl")))
            kw.pop("USE_GDC", None)
            kw.pop("launch_pdl", None)
            return self.kernel[grid](*args, **kw)

        return launch


def _children():
    g = torch.Generator().manual_seed(0)
    return TK.children(torch.randn(3, 70, generator=g) * 3, 4, CONF_FLOOR, base=torch.randn(3, generator=g))


def _race():
    g = torch.Generator().manual_seed(1)
    q = torch.softmax(torch.randn(2, 50, generator=g), -1)
    return TK.race_children(q, torch.empty_like(q).exponential_(generator=g), 3, CONF_FLOOR)


def _rank():
    v = torch.randn(40, generator=torch.Generator().manual_seed(2)).round(decimals=1)  # ties
    return TK.rank_top_ids(v, 6, 100)


def _expand():
    g = torch.Generator().manual_seed(3)
    mask = torch.rand(10, 37, generator=g) > 0.6
    states, tokens = TK.expand_rows(torch.tensor([7, 0, 3, 11]), 4, torch.randn(3, 20, generator=g),
                                    torch.randint(0, 50, (12,), generator=g), torch.randperm(50, generator=g), mask,
                                    5, 1, True)
    return states, tokens, mask


def _argmax():
    return (TK.argmax_keys(torch.randn(5, 3000, generator=torch.Generator().manual_seed(5))),)


def _select():
    parents = torch.tensor([-1, -1, -1, 0, 0, 0, 2, 2, 2])
    conf = torch.tensor([[0.5, 0.3, 0.1], [0.6, 0.2, 0.1], [0.4, 0.4, 0.3]])
    return TK.select_tree(torch.tensor([5]), torch.tensor([0, 2, 3, 7]), parents, torch.arange(11, 20),
                          torch.tensor([1, 1, 1, 2, 2, 2, 2, 2, 2]), -torch.arange(9.0) / 4, torch.arange(40).flip(0),
                          conf)


def _parents(t: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(t)
    return torch.tensor([-1] + [int(torch.randint(0, j, (1,), generator=g)) for j in range(1, t)])


def _tree9() -> tuple[torch.Tensor, torch.Tensor]:
    """(parents, depths) [9] of a random tree."""
    parents = _parents(9)
    depths = torch.zeros(9, dtype=torch.long)
    for j in range(1, 9):
        depths[j] = depths[parents[j]] + 1
    return parents, depths


def _accept():
    parents, depths = _tree9()
    g = torch.Generator().manual_seed(4)
    return TK.accept_path(torch.randint(0, 3, (9,), generator=g), parents, depths, ancestry(parents, check=False),
                          torch.randint(0, 3, (9,), generator=g), 4)


def _sampled_walk():
    parents, depths = _tree9()
    g = torch.Generator().manual_seed(7)
    kids = sibling_table_of(parents, 8)
    q_at = torch.rand(9, generator=g) + 0.1
    return TK.sampled_accept_path(parents, kids, kids > 0, q_at * torch.rand(9, generator=g) * 1.5, q_at,
                                  torch.rand(9, generator=g), ancestry(parents, check=False), depths, 4)


def _ancestry():
    return (TK.ancestry(_parents(12), 11),)


def _tail():
    g = torch.Generator().manual_seed(5)
    t, p = 8, 4
    cache = torch.randn(2, 2, 2, 30, 8, generator=g)
    ids, state_out, feats_out = torch.randint(0, 90, (40,), generator=g), torch.zeros(4 + p, dtype=torch.long), \
        torch.zeros(p, 12)
    result = RK.round_tail(cache, ids, state_out, feats_out, torch.randn(t, 12, generator=g),
                           torch.randint(0, 90, (t,), generator=g), _parents(t), torch.randint(0, 4, (t,), generator=g),
                           torch.tensor([0, 1, 1, 0]), torch.tensor(3), torch.tensor([7]), torch.tensor([0, 2, 5, 1]),
                           torch.tensor(13), torch.tensor(9))
    return result, cache, ids, state_out, feats_out


def _sampled():
    g = torch.Generator().manual_seed(6)
    parents = torch.tensor([-1, 0, 0, 1, 1, 0])
    kids = sibling_table_of(parents, 3)
    p = torch.softmax(torch.randn(6, 40, generator=g) * 2, -1)
    q = torch.softmax(torch.randn(6, 40, generator=g) * 2, -1)
    tokens = torch.randperm(40, generator=g)[:6]
    live = kids > 0
    r_at, q_at, state = SK.sibling_tests(tokens, kids, p, q, live, chunk=16)
    ref_r, ref_q, ref_final = sibling_tests(tokens, kids, p, q, live)
    on = kids[live]
    torch.testing.assert_close(r_at[on], ref_r[on], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(q_at[on], ref_q[on], rtol=1e-5, atol=1e-6)
    final = SK.final_residual(p, q, state, torch.tensor([0]))
    torch.testing.assert_close(final[0] / final[0].sum(), ref_final[0] / ref_final[0].sum(), rtol=1e-5, atol=1e-6)
    return r_at, q_at, final


LAUNCHERS = {  # launcher -> the kernels it launches, in order
    "children": (_children, ["_chunk_top_kernel", "_merge_top_kernel"]),
    "race_children": (_race, ["_race_chunk_kernel", "_race_merge_kernel"]),
    "rank_top_ids": (_rank, ["_rank_top_kernel"]),
    "expand_rows": (_expand, ["_expand_rows_kernel"]),
    "argmax_keys": (_argmax, ["_argmax_chunk_kernel"]),
    "select_tree": (_select, ["_select_tree_kernel"]),
    "accept_path": (_accept, ["_accept_path_kernel"]),
    "sampled_accept_path": (_sampled_walk, ["_sampled_accept_path_kernel"]),
    "ancestry": (_ancestry, ["_ancestry_kernel"]),
    "round_tail": (_tail, ["_round_tail_kernel"]),
    "sibling_tests+final_residual": (_sampled, ["_left_kernel", "_rank_kernel", "_rank_kernel", "_rank_kernel",
                                                "_final_kernel"]),
}


@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_launchers_hand_pdl_to_every_launch_and_it_changes_nothing(launcher, monkeypatch):
    """Off (the interpreter), then pdl made to say yes (the kernels spied on and run without PDL): every launch gets
    USE_GDC = launch_pdl = True (and no PDL keyword at all while off), pdl is asked about an input tensor of the
    launch, and the results are the same, bitwise."""
    run, expected = LAUNCHERS[launcher]
    for module in MODULES:
        module._load()
    log: list = []
    for module in MODULES:
        for name in module._JITTED:
            if name.endswith("_kernel"):
                monkeypatch.setattr(module, name, _Spy(getattr(module, name), name, log))
    want = run()
    assert log == [(name, None, None) for name in expected]
    asked = []
    for module in MODULES:
        monkeypatch.setattr(module, "pdl", lambda t: asked.append(t) or True)
    log.clear()
    got = run()
    assert log == [(name, True, True) for name in expected]
    assert asked and all(isinstance(t, torch.Tensor) for t in asked)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
