"""Per-drafter tree shapes (api.tree_defaults / tree_spec): a flag left out takes the drafter's measured
recommendation, then the generic default; a malformed manifest field is a one-line error naming it."""

from __future__ import annotations

import argparse
import types

import pytest

from eaglespec.api import DEFAULT_DRAFT, GENERIC_TREES, resolve_trees, tree_defaults, tree_label, tree_spec
from eaglespec.cli.bench import resolve_tree_args
from eaglespec.errors import EagleSpecError
from eaglespec.tree.auto import wants_auto


def _drafter(manifest):
    return types.SimpleNamespace(manifest=manifest)


RECOMMENDED = {"chain": {"k": 3}, "dynamic": {"depth": 5, "top_k": 6, "budget": 24}, "measured": "notes"}


def test_generic_defaults_without_a_recommendation():
    assert tree_defaults(_drafter(None)) == {}
    assert tree_spec("chain").depth == GENERIC_TREES["chain"]["k"] == 5
    dyn = tree_spec("dynamic", defaults={})
    assert (dyn.depth, dyn.top_k, dyn.budget) == (8, 10, 60)


def test_recommendation_fills_only_the_knobs_left_out():
    found = tree_defaults(_drafter({"tree_defaults": RECOMMENDED}))
    assert "measured" not in found
    assert tree_spec("chain", defaults=found).depth == 3
    assert tree_spec("chain", k=7, defaults=found).depth == 7  # an explicit flag wins
    dyn = tree_spec("dynamic", depth=9, defaults=found)
    assert (dyn.depth, dyn.top_k, dyn.budget) == (9, 6, 24)
    static = tree_spec("static", defaults=found)  # no static recommendation: generic
    assert (static.depth, static.top_k, static.budget) == (8, 10, 60)
    assert tree_label(dyn) == "dynamic depth 9 top-k 6 budget 24"
    assert tree_label(tree_spec("chain", k=0)) == "chain k=0"


@pytest.mark.parametrize("bad, field", [
    ({"tree_defaults": [1]}, "tree_defaults must be an object"),
    ({"tree_defaults": {"dynamic": 5}}, "tree_defaults.dynamic must be an object"),
    ({"tree_defaults": {"dynamic": {"depth": -1}}}, "tree_defaults.dynamic.depth"),
    ({"tree_defaults": {"dynamic": {"depth": "5"}}}, "tree_defaults.dynamic.depth"),
    ({"tree_defaults": {"chain": {"depth": 5}}}, "tree_defaults.chain.depth"),  # chains take k
    ({"tree_defaults": {"chain": {"k": True}}}, "tree_defaults.chain.k"),
])
def test_malformed_recommendation_is_named(bad, field):
    with pytest.raises(EagleSpecError, match=field) as err:
        tree_defaults(_drafter(bad), "drafter /x")
    assert str(err.value).startswith("drafter /x: eaglespec_manifest.json field")


def test_shipped_drafter_recommends_measured_shapes():
    from eaglespec.checkpoint.config import read_json

    found = tree_defaults(_drafter(read_json(DEFAULT_DRAFT / "eaglespec_manifest.json")))
    assert found["chain"] == {"k": 5}
    assert found["dynamic"] == {"depth": 7, "top_k": 10, "budget": 60}  # the shape fitted under round graphs
    assert found["static"] == {"depth": 5, "top_k": 10, "budget": 25}
    drafter = _drafter(read_json(DEFAULT_DRAFT / "eaglespec_manifest.json"))
    # no tree named: --tree auto on a GPU (an acceptance profile and no tree_defaults.cuda), the cpu chain on a CPU
    assert wants_auto({}, drafter, "cuda") and not wants_auto({}, drafter, "cpu")
    assert not wants_auto({"tree": "dynamic"}, drafter, "cuda") and not wants_auto({"k": 3}, drafter, "cuda")
    # with a temperature a named static tree is EAGLE-1's cut to depth 3, all 20 of its nodes (the budget named, so
    # no shortfall note; sampled.static merged knob by knob: top-k stays the base's); a greedy one keeps depth 5
    # and 25 nodes
    _, sampled_on_gpu = resolve_trees({"tree": "static"}, drafter, device="cuda")
    assert (sampled_on_gpu.depth, sampled_on_gpu.top_k, sampled_on_gpu.budget) == (3, 10, 20)
    assert sampled_on_gpu.static_shortfall() is None and len(sampled_on_gpu.static_choices()) == 20
    greedy_static, sampled_static = resolve_trees({"tree": "static"}, drafter, device="cuda")
    assert (greedy_static.depth, greedy_static.budget, sampled_static.depth, sampled_static.budget) == (5, 25, 3, 20)
    assert resolve_trees({"tree": "chain"}, drafter, device="cuda") == (tree_spec("chain", 5), tree_spec("chain", 3))
    # a named dynamic tree takes one shape for greedy and sampled requests (no sampled override)
    assert resolve_trees({"tree": "dynamic"}, drafter, device="cuda") == (tree_spec("dynamic", None, 10, 7, 60), None)
    on_cpu, sampled_on_cpu = resolve_trees({}, drafter, device="cpu")
    assert (on_cpu.kind, on_cpu.depth, sampled_on_cpu) == ("chain", 3, None)  # tree_defaults.cpu


def test_cpu_overrides_apply_on_cpu_only():
    """tree_defaults.cpu overrides shapes knob by knob on a CPU device (bench's shapes too), nowhere else; a
    malformed override is one line naming its field."""
    from eaglespec.api import resolve_trees

    manifest = {"tree_defaults": {**RECOMMENDED, "cpu": {"chain": {"k": 2}, "dynamic": {"budget": 8}}}}
    drafter = _drafter(manifest)
    assert tree_defaults(drafter)["chain"] == {"k": 3} and "cpu" not in tree_defaults(drafter)
    assert tree_defaults(drafter, device="cuda")["chain"] == {"k": 3}
    on_cpu = tree_defaults(drafter, device="cpu")
    assert on_cpu["chain"] == {"k": 2} and on_cpu["dynamic"] == {"depth": 5, "top_k": 6, "budget": 8}
    assert resolve_trees({}, drafter, device="cpu")[0].depth == 2
    assert resolve_trees({"k": 4}, drafter, device="cpu")[0].depth == 4  # an explicit flag wins
    assert resolve_trees({"tree": "chain"}, drafter, device="cuda")[0].depth == 3
    args = argparse.Namespace(k=None, depth=None, top_k=None, budget=None)
    resolve_tree_args(args, drafter, "cpu")
    assert (args.k, args.depth, args.top_k, args.budget) == (2, 5, 6, 8)
    for bad, field in (({"cpu": [1]}, r"tree_defaults\.cpu must be an object"),
                       ({"cpu": {"chain": {"k": -1}}}, r"tree_defaults\.cpu\.chain\.k")):
        with pytest.raises(EagleSpecError, match=field):
            tree_defaults(_drafter({"tree_defaults": bad}), "drafter /x", device="cpu")
    assert tree_defaults(_drafter({"tree_defaults": {"cpu": [1]}}), device="cuda") == {}  # read where it applies


def test_greedy_overrides_apply_to_greedy_requests_only():
    """tree_defaults.greedy overrides shapes knob by knob for requests at temperature 0 (a wider tree pays when every
    row is an argmax check), named trees included; sampled requests keep the base shapes, a CPU device its own."""
    from eaglespec.api import resolve_trees

    manifest = {"tree_defaults": {**RECOMMENDED, "greedy": {"dynamic": {"top_k": 12, "budget": 48}},
                                  "cpu": {"dynamic": {"budget": 16}}}}
    drafter = _drafter(manifest)
    assert tree_defaults(drafter)["dynamic"] == {"depth": 5, "top_k": 6, "budget": 24}
    assert tree_defaults(drafter, greedy=True)["dynamic"] == {"depth": 5, "top_k": 12, "budget": 48}
    assert tree_defaults(drafter, device="cpu", greedy=True)["dynamic"] == {"depth": 5, "top_k": 12, "budget": 16}
    spec, sampled = resolve_trees({"tree": "dynamic"}, drafter, device="cuda")
    assert (spec.top_k, spec.budget, sampled.top_k, sampled.budget) == (12, 48, 6, 24)
    spec, sampled = resolve_trees({"tree": "dynamic", "budget": 30}, drafter, device="cuda")
    assert (spec.budget, sampled.budget) == (30, 30)  # an explicit flag wins for both
    assert resolve_trees({"tree": "chain"}, drafter, device="cuda")[1] is None  # nothing to override: one tree
    for temperature, shape in ((0.0, (12, 48)), (1.0, (6, 24))):
        args = argparse.Namespace(k=None, depth=None, top_k=None, budget=None, temperature=temperature)
        resolve_tree_args(args, drafter, "cuda")
        assert (args.top_k, args.budget) == shape
    with pytest.raises(EagleSpecError, match=r"tree_defaults\.greedy\.dynamic\.budget"):
        tree_defaults(_drafter({"tree_defaults": {"greedy": {"dynamic": {"budget": -1}}}}), "drafter /x", greedy=True)


def test_bench_resolves_and_records_the_shapes_it_runs():
    args = argparse.Namespace(k=None, depth=None, top_k=8, budget=None)
    resolve_tree_args(args, _drafter({"tree_defaults": RECOMMENDED}))
    assert (args.k, args.depth, args.top_k, args.budget) == (3, 5, 8, 24)
    args = argparse.Namespace(k=None, depth=None, top_k=None, budget=None)
    resolve_tree_args(args, None)  # no drafter: generic
    assert (args.k, args.depth, args.top_k, args.budget) == (5, 8, 10, 60)


def test_a_sampled_policy_applies_only_when_no_tree_is_named():
    from eaglespec.api import resolve_trees

    manifest = {"tree_defaults": {**RECOMMENDED, "static": {"depth": 4, "budget": 12}, "sampled": "static"}}
    spec, sampled = resolve_trees({"tree": None, "k": None}, _drafter(manifest))
    assert (spec.kind, spec.depth) == ("chain", 3)
    assert (sampled.kind, sampled.depth, sampled.budget) == ("static", 4, 12)
    assert resolve_trees({"tree": "chain"}, _drafter(manifest))[1] is None  # named: used at every temperature
    assert resolve_trees({"tree": "dynamic"}, _drafter(manifest))[0].kind == "dynamic"
    assert resolve_trees({}, _drafter({"tree_defaults": RECOMMENDED}))[1] is None  # no policy: one tree
    with pytest.raises(EagleSpecError, match=r"tree_defaults\.sampled must be one of"):
        resolve_trees({}, _drafter({"tree_defaults": {"sampled": "beam"}}), "drafter /x")


def test_a_sampled_policy_may_name_its_shape():
    """tree_defaults.sampled = {"chain": {"k": 2}}: requests with a temperature draft that chain, greedy ones keep
    the chain's own shape (and on a CPU device tree_defaults.cpu wins: it is measured there); bench's rows at a
    temperature follow it. A malformed shape is one line naming its field."""
    from eaglespec.api import resolve_trees

    manifest = {"tree_defaults": {**RECOMMENDED, "cuda": "dynamic", "sampled": {"chain": {"k": 2}}}}
    spec, sampled = resolve_trees({}, _drafter(manifest), device="cuda")
    assert (spec.kind, spec.depth, spec.budget) == ("dynamic", 5, 24)
    assert (sampled.kind, sampled.depth) == ("chain", 2)
    spec, sampled = resolve_trees({}, _drafter(manifest), device="cpu")  # greedy chain k=3, sampled chain k=2
    assert (spec.kind, spec.depth, sampled.kind, sampled.depth) == ("chain", 3, "chain", 2)
    assert resolve_trees({"k": 4}, _drafter(manifest), device="cpu") == (tree_spec("chain", 4), None)  # flag wins
    assert resolve_trees({"tree": "chain"}, _drafter(manifest), device="cuda")[0].depth == 3  # named: its shape
    with_cpu = {"tree_defaults": {**manifest["tree_defaults"], "cpu": {"chain": {"k": 4}}}}
    assert resolve_trees({}, _drafter(with_cpu), device="cpu") == (tree_spec("chain", 4), None)
    assert tree_defaults(_drafter(manifest))["chain"] == {"k": 3}  # greedy requests: unchanged
    assert tree_defaults(_drafter(manifest), sampled=True)["chain"] == {"k": 2}
    for temperature, k in ((0.0, 3), (1.0, 2)):
        args = argparse.Namespace(k=None, depth=None, top_k=None, budget=None, temperature=temperature)
        resolve_tree_args(args, _drafter(manifest), "cuda")
        assert args.k == k
    # a kind named beside the shapes sampled requests take: static trees, and a chain named at a temperature k=2
    named = {"tree_defaults": {**RECOMMENDED, "cuda": "dynamic", "sampled": {"kind": "static", "chain": {"k": 2}}}}
    spec, sampled = resolve_trees({}, _drafter(named), device="cuda")
    assert (spec.kind, sampled.kind, sampled.budget) == ("dynamic", "static", 60)
    assert resolve_trees({"tree": "chain"}, _drafter(named), device="cuda") == (tree_spec("chain", 3),
                                                                               tree_spec("chain", 2))
    for bad, field in (({"sampled": {"chain": {"k": -1}}}, r"tree_defaults\.sampled\.chain\.k"),
                       ({"sampled": {"kind": "beam"}}, r"tree_defaults\.sampled must be one of .*got 'beam'"),
                       ({"sampled": {"beam": {}}}, r"tree_defaults\.sampled must be one of .*with its shape"),
                       ({"sampled": {"chain": {}, "static": {}}}, r"tree_defaults\.sampled must be one of")):
        with pytest.raises(EagleSpecError, match=field):
            resolve_trees({}, _drafter({"tree_defaults": bad}), "drafter /x", device="cuda")


def test_a_cpu_sampled_policy_applies_on_cpu_only():
    """tree_defaults.cpu.sampled: the sampled policy on a CPU device (kind and shape), tree_defaults.sampled
    elsewhere; tree_defaults.cpu's shapes still apply on top; a malformed one is one line naming its field."""
    from eaglespec.api import recommended_tree, resolve_trees

    manifest = {"tree_defaults": {**RECOMMENDED, "cuda": "dynamic", "sampled": {"static": {"budget": 12}},
                                  "cpu": {"chain": {"k": 2}, "sampled": {"dynamic": {"budget": 9}}}}}
    drafter = _drafter(manifest)
    spec, sampled = resolve_trees({}, drafter, device="cuda")
    assert (spec.kind, sampled.kind, sampled.budget) == ("dynamic", "static", 12)
    spec, sampled = resolve_trees({}, drafter, device="cpu")
    assert (spec.kind, spec.depth) == ("chain", 2)
    assert (sampled.kind, sampled.depth, sampled.top_k, sampled.budget) == ("dynamic", 5, 6, 9)
    assert recommended_tree(drafter, "sampled", device="cpu") == "dynamic"
    assert recommended_tree(drafter, "sampled") == recommended_tree(drafter, "sampled", device="cuda") == "static"
    assert tree_defaults(drafter, device="cuda", sampled=True)["static"] == {"budget": 12}
    assert "static" not in tree_defaults(drafter, device="cpu", sampled=True)  # tree_defaults.sampled's: not here
    only_kind = {"tree_defaults": {"sampled": "static", "cpu": {"sampled": "chain"}}}
    assert resolve_trees({}, _drafter(only_kind), device="cpu") == (tree_spec("chain"), None)
    assert resolve_trees({"tree": "static"}, drafter, device="cpu")[0].kind == "static"  # named wins
    with pytest.raises(EagleSpecError, match=r"tree_defaults\.cpu\.sampled must be one of"):
        resolve_trees({}, _drafter({"tree_defaults": {"cpu": {"sampled": "beam"}}}), "drafter /x", device="cpu")
    with pytest.raises(EagleSpecError, match=r"tree_defaults\.cpu\.sampled\.chain\.k"):
        resolve_trees({}, _drafter({"tree_defaults": {"cpu": {"sampled": {"chain": {"k": -1}}}}}), "drafter /x",
                      device="cpu")


def test_a_cuda_policy_applies_on_cuda_devices_only():
    from eaglespec.api import resolve_trees

    manifest = {"tree_defaults": {**RECOMMENDED, "cuda": "dynamic", "sampled": "chain"}}
    spec, sampled = resolve_trees({"tree": None}, _drafter(manifest), device="cuda")
    assert (spec.kind, spec.depth, spec.top_k, spec.budget) == ("dynamic", 5, 6, 24)  # its recommended shape
    assert (sampled.kind, sampled.depth) == ("chain", 3)  # sampled requests: the chain
    spec, sampled = resolve_trees({"tree": None}, _drafter(manifest), device="cpu")
    assert spec.kind == "chain" and sampled is None  # the sampled policy is the tree already in use
    assert resolve_trees({"tree": "static"}, _drafter(manifest), device="cuda")[0].kind == "static"  # named wins
    with pytest.raises(EagleSpecError, match=r"tree_defaults\.cuda must be one of"):
        resolve_trees({}, _drafter({"tree_defaults": {"cuda": 3}}), "drafter /x", device="cuda")


def test_sampled_requests_draft_with_the_sampled_tree():
    """EagleSpec with a sampled_spec: requests with a temperature draft static trees, greedy ones chains, and
    the engine's own tree stays the chain (also when a sampled stream is abandoned)."""
    from eaglespec.api import EagleSpec
    from eaglespec.config import EngineConfig
    from eaglespec.tree.core import TreeSpec

    from conftest import byte_tokenizer, tiny_drafter, tiny_target

    model = tiny_target("llama", seed=1)
    tok = byte_tokenizer()
    chain, static = TreeSpec("chain", depth=3), TreeSpec("static", depth=3, top_k=4, budget=8)
    es = EagleSpec(model, tok, tiny_drafter(model, seed=2), chain, config=EngineConfig(backend="hf"),
                   sampled_spec=static)
    seen = []
    orig = es.engine.proposer.propose
    es.engine.proposer.propose = lambda *a: seen.append(es.engine.proposer.spec.kind) or orig(*a)
    es.generate([5, 6, 7], 8, temperature=0.8, seed=1)
    assert seen and set(seen) == {"static"} and es.engine.spec is chain  # the tree is per stream
    seen.clear()
    es.generate([5, 6, 7], 8)
    assert set(seen) == {"chain"}
    stream = es.stream([5, 6, 7], 8, temperature=0.8, seed=1)
    next(iter(stream))
    del stream
    import gc

    gc.collect()
    assert es.engine.spec is chain
    assert es.tree_for(0.8) is static and es.tree_for(None) is chain and es.tree_for(0.0) is chain


def test_sampled_policy_can_hold_a_fitted_static_tree():
    """tree_defaults.sampled.static.choices (bench/fit_sampled_tree.py's tree): requests with a temperature draft it,
    cut to the policy's depth and budget; greedy static requests keep EAGLE-1's tree; a malformed one names its
    field."""
    fitted = [[0], [1], [0, 0], [2], [0, 0, 0]]
    drafter = _drafter({"tree_defaults": {"static": {"depth": 5, "top_k": 10, "budget": 25}, "cuda": "dynamic",
                                          "sampled": {"kind": "static",
                                                      "static": {"choices": fitted, "depth": 2, "budget": 4}}}})
    greedy, sampled = resolve_trees({"tree": "static"}, drafter, device="cuda")
    assert greedy.choices is None and len(greedy.static_choices()) == 25
    assert sampled.static_choices() == ((0,), (1,), (0, 0), (2,))
    _, default_sampled = resolve_trees({}, drafter, device="cuda")
    assert default_sampled.kind == "static" and default_sampled.static_choices() == sampled.static_choices()
    bad = _drafter({"tree_defaults": {"sampled": {"kind": "static", "static": {"choices": [[1, 0]]}}}})
    with pytest.raises(EagleSpecError, match=r"field tree_defaults\.sampled\.static\.choices is not a static tree"):
        tree_defaults(bad, sampled=True)
