"""--tree auto: the cost model and chooser on synthetic curves and profiles, the acceptance profile's validation,
the measurements on a tiny model, greedy exactness of the chosen trees, and the fast backend's memory check."""

from __future__ import annotations

import argparse
import json
import math
import re
import types

import pytest
import torch

from eaglespec import EagleSpec, EagleSpecError
from eaglespec.api import resolve_trees
from eaglespec.checkpoint.manifest import read_acceptance_profile, with_acceptance_profile
from eaglespec.tree.auto import (
    Acceptance,
    AcceptanceProfile,
    CostModel,
    Curve,
    DynamicTaus,
    Overhead,
    RoundShape,
    auto_trees,
    candidates,
    chain_tau,
    choose,
    fit_overhead,
    predict,
    round_shape,
    static_shape,
    wants_auto,
)
from eaglespec.tree.core import MC_SIM_7B_63, TreeSpec

from conftest import BYTE_VOCAB, byte_tokenizer, reference_greedy, tiny_drafter, tiny_target

ROWS = (1, 2, 4, 8, 16, 32, 64, 128)
MS = 1e-3


def costs(verify=lambda r: 1.0, draft=lambda r: 0.0, plain=1.0, round_s=0.0, step_s=0.0, sampled=None,
          bucketed=True) -> CostModel:
    """A CostModel from per-row functions in ms."""
    return CostModel(Curve(ROWS[:7], tuple(draft(r) * MS for r in ROWS[:7]), bucketed),
                     Curve(ROWS, tuple(verify(r) * MS for r in ROWS), bucketed),
                     Overhead(plain * MS, round_s * MS, step_s * MS), sampled, device="synthetic")


def table(depth: int, ranks: list[float]) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(ranks) for _ in range(depth))


GOOD = Acceptance(table(8, [0.7, 0.15, 0.05, 0.03, 0.02, 0.01, 0.01, 0.01, 0.01, 0.01]))


# -- curves and round shapes ----------------------------------------------------------------------------
def test_curve_buckets_interpolates_and_extrapolates():
    c = Curve((1, 4, 8), (1.0, 2.0, 4.0))
    assert c(1) == c(0.5) == 1.0 and c(4) == 2.0
    assert c(2) == pytest.approx(1 + 1 / 3) and c(6) == pytest.approx(3.0)
    assert c(12) == pytest.approx(6.0)  # along the last segment
    b = Curve((1, 4, 8), (1.0, 2.0, 4.0), bucketed=True)
    assert b(2) == b(3) == 2.0 and b(5) == 4.0  # padded to the next measured row count
    assert b.linear(2) == pytest.approx(c(2))
    with pytest.raises(EagleSpecError, match="increasing"):
        Curve((2, 1), (1.0, 1.0))
    with pytest.raises(EagleSpecError, match="as many seconds"):
        Curve((1, 2), (1.0,))


def test_round_shapes():
    assert round_shape(TreeSpec("chain", depth=4)) == RoundShape(5, (1, 1, 1), chain=True)
    assert round_shape(TreeSpec("dynamic", depth=3, top_k=4, budget=10)) == RoundShape(11, (4, 4))
    assert round_shape(TreeSpec("dynamic", depth=2, top_k=2, budget=50)).verify_rows == 7  # 2 + 4 candidates
    # EAGLE-1's tree: nodes with children at depths 1..4 (the rows Proposer._static runs)
    assert round_shape(TreeSpec("static", depth=5, budget=25)) == RoundShape(26, (4, 4, 1, 1))
    assert static_shape([(0,), (1,), (0, 0)]) == RoundShape(4, (1,))


def test_fit_overhead_recovers_round_and_step_costs():
    c = costs(verify=lambda r: 1 + 0.01 * r, draft=lambda r: 0.1 + 0.001 * r)
    specs = [TreeSpec("chain", depth=2), TreeSpec("chain", depth=5), TreeSpec("dynamic", depth=4, top_k=4, budget=12),
             TreeSpec("static", depth=5, budget=25)]
    points = []
    for spec in specs:
        shape = round_shape(spec)
        points.append((shape, 1.5, c.forward_seconds(shape, 1.5) + 0.3 * MS + 0.05 * MS * len(shape.draft_rows)))
    o = fit_overhead(points, c.draft, c.verify, 2 * MS)
    assert o.plain_s == 2 * MS and o.round_s == pytest.approx(0.3 * MS) and o.step_s == pytest.approx(0.05 * MS)
    assert fit_overhead([], c.draft, c.verify, 2 * MS) == Overhead(2 * MS)
    # rounds that cost less than their forwards timed one by one (a round graph): a negative step overhead, never
    # below minus a one-row drafter step
    cheaper = [(shape, tau, secs - 0.08 * MS * len(shape.draft_rows)) for shape, tau, secs in points]
    assert fit_overhead(cheaper, c.draft, c.verify, 2 * MS).step_s == pytest.approx(-0.03 * MS)
    much = [(shape, tau, secs - 0.5 * MS * len(shape.draft_rows)) for shape, tau, secs in points]
    assert fit_overhead(much, c.draft, c.verify, 2 * MS).step_s == pytest.approx(-c.draft(1))


def test_chain_and_tree_overheads_are_fitted_apart():
    """Chain steps (an argmax) and tree steps (top-k and selection) cost differently: each kind's rounds give its
    own overheads, and a round is predicted with its kind's."""
    c = costs(verify=lambda r: 1 + 0.01 * r, draft=lambda r: 0.1 + 0.001 * r)
    chain_cost, tree_cost = (0.1 * MS, 0.02 * MS), (0.4 * MS, 0.3 * MS)
    specs = [TreeSpec("chain", depth=2), TreeSpec("chain", depth=5), TreeSpec("dynamic", depth=4, top_k=4, budget=12),
             TreeSpec("dynamic", depth=7, top_k=8, budget=48), TreeSpec("static", depth=5, budget=25)]
    points = []
    for spec in specs:
        shape = round_shape(spec)
        per_round, per_step = chain_cost if spec.kind == "chain" else tree_cost
        points.append((shape, 1.5, c.forward_seconds(shape, 1.5) + per_round + per_step * len(shape.draft_rows)))
    o = fit_overhead(points, c.draft, c.verify, 2 * MS)
    assert (o.round_s, o.step_s) == pytest.approx(tree_cost) and o.of(chain=True) == pytest.approx(chain_cost)
    model = CostModel(c.draft, c.verify, o)
    for (_, tau, secs), spec in zip(points, specs):
        assert model.round_seconds(spec, tau) == pytest.approx(secs)
    trees_only = fit_overhead(points[2:], c.draft, c.verify, 2 * MS)  # no chain rounds: chains take the trees' fit
    assert trees_only.of(chain=True) == pytest.approx(tree_cost) and trees_only.chain_round_s is None


def test_cost_model_round_trips_through_json():
    c = costs(verify=lambda r: 1 + r, sampled=Overhead(3 * MS, 0.1 * MS, 0.2 * MS, 0.05 * MS, -0.01 * MS))
    back = CostModel.from_dict(json.loads(json.dumps(c.to_dict())))
    assert back == c
    with pytest.raises(EagleSpecError, match="version"):
        CostModel.from_dict({**c.to_dict(), "version": 99})
    with pytest.raises(EagleSpecError, match="verify"):
        CostModel.from_dict({**c.to_dict(), "verify": {"rows": [1], "seconds": ["x"]}})


# -- the chooser: known optima ----------------------------------------------------------------------------
def test_flat_verify_cost_picks_the_deepest_widest_tree():
    best = choose(GOOD, costs())  # every forward costs the same, drafting is free: more nodes never cost more
    assert best.kind == "static" and best.depth == 8 and best.budget == 127
    assert best.tau == max(p.tau for p in candidates(GOOD, costs()))
    spec = best.spec()
    assert spec.kind == "static" and len(spec.static_choices()) == 127


def test_steep_verify_cost_picks_a_short_chain():
    acc = Acceptance(table(8, [0.8, 0.1, 0.05]))
    c = costs(verify=lambda r: 1 + 0.3 * (r - 1), bucketed=False)
    best = choose(acc, c)
    # chains: tau / (1 + 0.3 k) ms is largest at k = 3 (2.952 / 1.9), and no sibling pays its 0.3 ms
    rates = {k: chain_tau(acc.accept, k) / (1 + 0.3 * k) for k in range(1, 9)}
    assert max(rates, key=rates.get) == 3
    assert (best.kind, best.depth) == ("chain", 3)
    assert best.tokens_per_second == pytest.approx(rates[3] / MS)


def test_zero_acceptance_does_not_speculate():
    zero = Acceptance(table(6, [0.0] * 4))
    assert choose(zero, costs()).kind == "plain"
    assert choose(zero, costs()).spec() == TreeSpec("chain", depth=0)
    # acceptance that does not pay for the drafter's steps
    low = Acceptance(table(6, [0.05, 0.01]))
    assert choose(low, costs(draft=lambda r: 0.2)).kind == "plain"


def test_measured_dynamic_taus_win_where_they_are_higher():
    dyn = DynamicTaus((4, 8), (8, 16, 32), (
        ((1.5, 1.6, 1.6), (1.9, 2.0, 2.1), (2.0, 2.2, 2.3)),  # width 4, depths 1..3
        ((1.6, 1.7, 1.7), (2.1, 2.4, 2.5), (2.3, 2.8, 3.2)),  # width 8
    ))
    acc = Acceptance(table(3, [0.3, 0.1]), dyn)
    assert dyn.at(8, 3, 24) == pytest.approx(3.0) and dyn.at(8, 3, 100) == 3.2 and dyn.at(4, 2, 4) == pytest.approx(
        1.45)
    assert dyn.at(6, 2, 8) is None and dyn.at(4, 4, 8) is None
    best = choose(acc, costs())
    assert (best.kind, best.top_k, best.depth, best.budget) == ("dynamic", 8, 3, 32)  # the first budget at the top
    assert best.spec() == TreeSpec("dynamic", depth=3, top_k=8, budget=32)
    # drafter steps of 8 rows that cost 1 ms each: a one-step tree of width 4 pays more
    best = choose(acc, costs(draft=lambda r: 1.0 if r >= 8 else 0.0))
    assert best.kind == "dynamic" and best.top_k == 4 and best.depth == 3


def test_predict_matches_the_candidates():
    c = costs(verify=lambda r: 1 + 0.01 * r, draft=lambda r: 0.1, round_s=0.2, step_s=0.05)
    for p in candidates(GOOD, c)[:20]:
        q = predict(p.spec(), GOOD, c)
        assert q.tau == pytest.approx(p.tau) and q.round_s == pytest.approx(p.round_s)
    static = predict(TreeSpec("static", depth=5, budget=25), GOOD, c)
    assert static.tau == pytest.approx(1 + sum(
        math.prod(GOOD.accept[i][r] for i, r in enumerate(p)) for p in MC_SIM_7B_63))


def test_temperature_and_fixed_knobs():
    profile = AcceptanceProfile(GOOD, Acceptance(table(8, [0.3, 0.1, 0.05])))
    c = costs(verify=lambda r: 1 + 0.02 * r, draft=lambda r: 0.05, sampled=Overhead(1 * MS, 0.5 * MS, 0.1 * MS))
    greedy, sampled = auto_trees({}, profile, c)
    assert greedy.tau > sampled.tau and greedy.budget > sampled.budget
    assert sampled.round_s == pytest.approx(predict(sampled.spec(), profile.sampled, c, sampled=True).round_s)
    # sampled rounds whose overhead eats any gain: plain decoding with a temperature
    c2 = costs(verify=lambda r: 1 + 0.02 * r, draft=lambda r: 0.05, sampled=Overhead(1 * MS, 5 * MS))
    assert auto_trees({}, profile, c2)[1].kind == "plain"
    assert auto_trees({}, AcceptanceProfile(GOOD, None), c)[1] is None  # no T=1 profile: the greedy tree
    g, _ = auto_trees({"budget": 8, "k": None}, profile, c)
    assert g.budget == 8 and g.kind in ("static", "dynamic")
    assert auto_trees({"k": 2}, profile, c)[0].spec() == TreeSpec("chain", depth=2)
    with pytest.raises(EagleSpecError, match="no tree shape"):
        choose(GOOD, c, fixed={"depth": 30})


# -- the acceptance profile in the manifest ---------------------------------------------------------------
PROFILE = {"t0": {"accept": [[0.6, 0.2], [0.5, 0.1]],
                  "dynamic": {"top_k": [2], "budgets": [2, 4], "tau": [[[1.7, 1.8], [2.2, 2.5]]]}},
           "t1": {"accept": [[0.4, 0.1], [0.3, 0.1]]}, "measured": "synthetic"}


@pytest.mark.parametrize("bad, field", [
    ([1], "acceptance_profile must be an object"),
    ({"measured": "x"}, "acceptance_profile must hold t0"),
    ({"t0": [[0.5]]}, "acceptance_profile.t0 must be an object"),
    ({"t0": {"accept": []}}, "acceptance_profile.t0.accept must be a non-empty"),
    ({"t0": {"accept": [[0.5, 0.1], [0.5]]}}, "acceptance_profile.t0.accept must be a non-empty"),
    ({"t1": {"accept": [[0.9, 0.2]]}}, r"acceptance_profile.t1.accept\[0\] must hold probabilities"),
    ({"t0": {"accept": [[-0.1]]}}, r"acceptance_profile.t0.accept\[0\]"),
    ({"t0": {"accept": [[0.5]], "dynamic": {"top_k": [2, 2], "budgets": [1], "tau": [[[1.0]]]}}},
     "acceptance_profile.t0.dynamic.top_k must be a non-empty increasing"),
    ({"t0": {"accept": [[0.5]], "dynamic": {"top_k": [2], "budgets": [1, 2], "tau": [[[1.0]]]}}},
     "acceptance_profile.t0.dynamic.tau must be a"),
    ({"t0": {"accept": [[0.5]], "dynamic": {"top_k": [2], "budgets": [1], "tau": [[[0.5]]]}}},
     "acceptance_profile.t0.dynamic.tau must be a"),
])
def test_malformed_profile_is_named(bad, field):
    with pytest.raises(EagleSpecError) as err:
        read_acceptance_profile({"acceptance_profile": bad}, "drafter /x")
    msg = str(err.value)
    assert msg.startswith("drafter /x: eaglespec_manifest.json field ") and "\n" not in msg
    assert re.search(field, msg)


def test_profile_reads_and_writes():
    assert read_acceptance_profile({}) is None
    found = read_acceptance_profile({"acceptance_profile": PROFILE})
    assert found["measured"] == "synthetic" and found["t0"]["dynamic"]["budgets"] == [2, 4]
    p = AcceptanceProfile.from_manifest({"acceptance_profile": PROFILE})
    assert p.greedy.accept == ((0.6, 0.2), (0.5, 0.1)) and p.greedy.dynamic.at(2, 2, 3) == pytest.approx(2.35)
    assert p.sampled.dynamic is None
    out = with_acceptance_profile({"method": "eagle3"}, PROFILE)
    assert out == {"method": "eagle3", "acceptance_profile": PROFILE}
    with pytest.raises(EagleSpecError, match="acceptance_profile"):
        with_acceptance_profile({}, {"t0": {"accept": [[2.0]]}})


def _drafter(manifest):
    return types.SimpleNamespace(manifest=manifest)


def test_auto_is_named_or_the_default_on_a_gpu_with_a_profile():
    with_profile = _drafter({"acceptance_profile": PROFILE})
    assert wants_auto({"tree": "auto"}, _drafter(None), "cpu")
    assert wants_auto({}, with_profile, "cuda") and wants_auto({"tree": None, "k": None}, with_profile, "cuda:0")
    assert not wants_auto({}, with_profile, "cpu")
    assert not wants_auto({}, _drafter({}), "cuda")
    recommends = _drafter({"acceptance_profile": PROFILE, "tree_defaults": {"cuda": "dynamic"}})
    assert not wants_auto({}, recommends, "cuda") and wants_auto({"tree": "auto"}, recommends, "cuda")
    assert not wants_auto({"k": 3}, with_profile, "cuda") and not wants_auto({"tree": "chain"}, with_profile, "cuda")
    # callers without measured costs keep today's defaults; a named auto needs them
    assert resolve_trees({}, with_profile, device="cuda")[0] == TreeSpec("chain", depth=5)
    with pytest.raises(EagleSpecError, match="round costs"):
        resolve_trees({"tree": "auto"}, with_profile)
    with pytest.raises(EagleSpecError, match="field acceptance_profile"):
        resolve_trees({"tree": "auto"}, _drafter({}), "drafter /d", costs=lambda: costs())


def test_resolve_trees_prints_the_choice(capsys):
    spec, sampled = resolve_trees({"tree": "auto"}, _drafter({"acceptance_profile": PROFILE}), costs=lambda: costs())
    assert spec == TreeSpec("dynamic", depth=2, top_k=2, budget=4)
    assert sampled is not None and sampled.kind == "static"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("eaglespec: --tree auto on synthetic: greedy: dynamic depth 2")
    assert "predicted" in err[0] and "tok/s" in err[0] and "sampled (T=1): static" in err[0]


def test_bench_reports_the_auto_tree_with_its_prediction(monkeypatch):
    from eaglespec import api
    from eaglespec.cli.bench import markdown, run_methods
    from eaglespec.engine import calibrate

    monkeypatch.setattr(api, "settle_heap", lambda: None)
    monkeypatch.setattr(calibrate, "costs_for", lambda *a, **k: costs(verify=lambda r: 1 + 0.4 * r, bucketed=False))
    model = tiny_target("llama", seed=4)
    drafter = tiny_drafter(model, seed=2)
    drafter.manifest = {"acceptance_profile": {"t0": {"accept": [[0.9, 0.05]] * 3}}}
    es = types.SimpleNamespace(model=model, tokenizer=types.SimpleNamespace(pad_token_id=0), drafter=drafter,
                               eos_ids=lambda: [2])
    args = argparse.Namespace(temperature=0.0, seed=0, k=3, depth=None, top_k=None, budget=None, max_len=96,
                              compile=False, max_new_tokens=6, warmup=1)
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    summaries, _ = run_methods(es, prompts, ["fast-plain", "eagle3-auto"], args)
    auto = summaries["eagle3-auto"]
    assert auto["tree"] == "chain k=3" and auto["predicted_tokens_per_second"] > 0 and auto["tokens_per_second"] > 0
    assert auto["same_text_as_fast_plain"] == {"sequences": 2, "identical": 2}
    report = {"environment": {"date": "d", "device": "cpu", "torch": "t", "transformers": "x", "commit": "c"},
              "config": {"target": "tiny", "dataset": "mtbench", "prompts": 2, "max_new_tokens": 6,
                         "dtype": "float32", "temperature": 0.0, "draft": "tiny", "k": 3, "depth": 8, "top_k": 10,
                         "budget": 60},
              "methods": summaries}
    assert "eagle3-auto drafts chain k=3 (--tree auto): predicted " in markdown(report)


def test_cli_accepts_tree_auto():
    from eaglespec.cli.args import add_tree_args

    p = argparse.ArgumentParser()
    add_tree_args(p)
    assert p.parse_args(["--tree", "auto"]).tree == "auto"


# -- measurements on a tiny model ---------------------------------------------------------------------------
def _engine(vocab: int = 96, seed: int = 3):
    from eaglespec.config import EngineConfig
    from eaglespec.engine.build import build_engine, build_target

    model = tiny_target("llama", seed=seed, vocab=vocab)
    drafter = tiny_drafter(model)
    cfg = EngineConfig(device="cpu")
    target = build_target(model, cfg, drafter.feature_layer_ids)
    return model, drafter, build_engine(target, drafter, TreeSpec("chain", depth=3), cfg)


def test_costs_are_measured_once_and_cached(monkeypatch, tmp_path):
    from eaglespec.engine import calibrate

    monkeypatch.setenv("EAGLESPEC_CACHE", str(tmp_path))
    model, drafter, engine = _engine()
    small = calibrate.CostSettings(context=16, samples=1, round_tokens=8, round_repeats=1)
    measured = calibrate.measure_costs(engine, small)
    assert measured.verify.rows == (1, 2, 4, 8, 16, 32, 64, 128) and measured.verify.bucketed
    assert measured.draft.rows == calibrate.DRAFT_ROWS and not measured.draft.bucketed  # eager rows on CPU
    assert measured.greedy.plain_s > 0 and measured.sampled is not None and measured.device.startswith("cpu")
    [check] = calibrate.round_errors(engine, measured, (TreeSpec("chain", depth=2),), new_tokens=8, repeats=1)
    assert check["measured_ms"] > 0 and check["predicted_ms"] > 0 and check["tau"] >= 1
    calls = []
    monkeypatch.setattr(calibrate, "measure_costs", lambda *a, **k: calls.append(1) or measured)
    first = calibrate.cached_costs(engine, model, drafter, log=lambda s: None)
    again = calibrate.cached_costs(engine, model, drafter, log=lambda s: None)
    assert first == again == measured and len(calls) == 1
    files = list((tmp_path / "tree_costs").glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["key"]["target"]
    files[0].write_text("{broken")
    assert calibrate.cached_costs(engine, model, drafter, log=lambda s: None) == measured and len(calls) == 2


def _walk(tree, truth, text, t, depth):
    """Accepted drafts of a greedy round rooted at text[t+1] over `tree` (as replay_dynamic walks it)."""
    node, n = 0, 0
    for d in range(1, depth + 1):
        hit = ((tree.parents == node) & (tree.tokens == truth[t + d])).nonzero()
        if not hit.numel():
            break
        node, n = int(hit[0, 0]), n + 1
        if text[t + 1 + d] != truth[t + d]:
            break
    return n


def test_replay_dynamic_equals_growing_each_tree():
    """replay_dynamic's accepted drafts (one full growth per anchor) equal those of each depth / budget's own tree."""
    from eaglespec.draft.proposer import Proposer, shifted_tokens
    from eaglespec.engine.calibrate import PLAIN, replay_dynamic

    _, drafter, engine = _engine(vocab=8, seed=4)  # 8 tokens: the random drafter hits often
    prompt = [3, 5, 1, 6]
    ids = prompt + engine.generate(prompt, 20, spec=PLAIN).token_ids
    depth, width, budgets = 3, 3, (1, 2, 4, 7, 12, 39)
    accepted = replay_dynamic(engine, ids, len(prompt), (width,), depth, budgets)  # [A, 1, D, B]
    x = torch.tensor(ids)
    engine.target.reset()
    out = engine.target.forward(x)
    truth, feats = out.logits.argmax(-1), out.features
    engine.target.reset()
    first = len(prompt) - 1
    anchors = range(first, len(ids) - 1 - depth)
    want = torch.zeros(len(anchors), depth, len(budgets), dtype=torch.long)
    for d in range(1, depth + 1):
        for j, b in enumerate(budgets):
            prop = Proposer(drafter, TreeSpec("dynamic", depth=d, top_k=width, budget=b), kernels=False)
            prop.catch_up(feats[:first], shifted_tokens(x, 0, first))
            for a, t in enumerate(anchors):
                tree = prop.propose(x[t + 1], feats[t:t + 1], shifted_tokens(x, t, 1))
                want[a, d - 1, j] = _walk(tree, truth, x, t, d)
    assert accepted.shape == (len(anchors), 1, depth, len(budgets))
    assert torch.equal(accepted[:, 0], want) and want.sum() > 0
    assert torch.all(accepted[..., 1:] >= accepted[..., :-1]) and torch.all(accepted[:, :, 1:] >= accepted[:, :, :-1])


def test_walked_rounds_are_the_engines_rounds():
    """At T=0 walk_rounds over replay_dynamic's drafts follows a greedy run's rounds exactly: the same accepted
    drafts, round by round, as the engine drafting that tree."""
    from eaglespec.engine.calibrate import PLAIN, replay_dynamic, walk_rounds

    _, _, engine = _engine(vocab=8, seed=4)
    prompt = [2, 7, 1]
    ids = prompt + engine.generate(prompt, 28, spec=PLAIN).token_ids
    widths, depth, budgets = (2, 3), 4, (2, 5, 9)
    accepted = replay_dynamic(engine, ids, len(prompt), widths, depth, budgets)
    tokens, rounds, visited = walk_rounds(accepted)
    for i, w in enumerate(widths):
        for d in range(1, depth + 1):
            for j, b in enumerate(budgets):
                run = engine.generate(prompt, 28, spec=TreeSpec("dynamic", depth=d, top_k=w, budget=b))
                assert run.token_ids == ids[len(prompt):]
                n = int(rounds[i, d - 1, j])
                walked = accepted[visited[:, i, d - 1, j], i, d - 1, j].tolist()
                assert [r.accepted for r in run.rounds[:n]] == walked and n > 3
                assert int(tokens[i, d - 1, j]) == sum(r.accepted + 1 for r in run.rounds[:n])
    assert rounds.min() > 0 and (tokens > rounds).any()


def test_measured_profile_is_a_valid_manifest_field():
    from eaglespec.engine.calibrate import measure_profile

    _, _, engine = _engine(vocab=8, seed=4)
    prof = measure_profile(engine, [[3, 5, 1], [2, 7]], 16, depth=3, top_k=3, dynamic_top_k=(2, 3, 20),
                           budgets=(1, 2, 4, 8), samples=4)
    found = read_acceptance_profile({"acceptance_profile": prof})
    assert found["t0"]["dynamic"]["top_k"] == [2, 3]  # widths above the draft vocabulary left out
    assert len(found["t0"]["accept"]) == 3 and len(found["t1"]["accept"][0]) == 3
    assert found["t0"]["anchors"] > 0 and found["t1"]["anchors"] > 0 and "2 prompts" in found["measured"]
    p = AcceptanceProfile.from_dict(prof)
    assert sum(p.greedy.accept[0]) > 0 and sum(p.sampled.accept[0]) > 0


# -- greedy exactness of the chosen trees ---------------------------------------------------------------------
@pytest.mark.parametrize("verify, kind", [
    (lambda r: 1.0, "dynamic"),  # flat verify: the widest measured dynamic tree
    (lambda r: 1 + 0.4 * r, "chain"),  # steep verify: a chain
])
def test_tree_auto_keeps_greedy_output_exact(monkeypatch, capsys, verify, kind):
    from eaglespec.engine import calibrate

    tok = byte_tokenizer()
    model = tiny_target(vocab=BYTE_VOCAB, seed=5)
    drafter = tiny_drafter(model)
    profile = {"t0": {"accept": [[0.9, 0.05, 0.02]] * 2,
                      "dynamic": {"top_k": [3], "budgets": [4, 12, 30],
                                  "tau": [[[1.7, 1.9, 1.9], [2.0, 2.6, 2.8], [2.1, 2.9, 3.3]]]}},
               "t1": {"accept": [[0.5, 0.2, 0.1]] * 3}}
    drafter.manifest = {"acceptance_profile": profile}
    es = EagleSpec(model, tok, drafter)
    monkeypatch.setattr(calibrate, "cached_costs", lambda *a, **k: costs(verify=verify, bucketed=False))
    es.choose_trees({"tree": "auto"})
    assert es.spec.kind == kind and es.engine.spec == es.spec
    assert "--tree auto" in capsys.readouterr().err
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        prompt = torch.randint(3, BYTE_VOCAB, (int(torch.randint(2, 12, (1,), generator=gen)),), generator=gen)
        out = es.generate(prompt.tolist(), max_new_tokens=24)
        assert out.token_ids == reference_greedy(model, prompt.tolist(), 24)


# -- memory: the fast backend's static cache ---------------------------------------------------------------
def test_cache_that_does_not_fit_is_one_line(monkeypatch):
    from eaglespec.backends import fast

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1000, 10**9))
    assert fast.free_device_memory(torch.device("cuda")) == 1000
    assert fast.free_device_memory(torch.device("cpu")) is None
    fast.check_fits("x", (2, 100), torch.bfloat16, torch.device("cuda"))  # 400 bytes fit
    with pytest.raises(EagleSpecError) as err:
        fast.check_fits("the fast backend's static KV cache", (4, 2, 2, 4097, 8), torch.bfloat16,
                        torch.device("cuda"))
    msg = str(err.value)
    assert "\n" not in msg and "[4, 2, 2, 4097, 8] in bfloat16 needs 1048832 bytes" in msg
    assert "cuda has 1000 bytes" in msg


def test_fast_cache_is_sized_from_the_context_and_checked(monkeypatch):
    from eaglespec.backends import fast

    model = tiny_target(seed=1)  # max_position_embeddings 512
    target = fast.FastTarget(model, max_len=100000)
    assert target.max_slots == 512 + 128 and target.max_len == 640  # capped at the context + one verify forward
    small = fast.FastTarget(model, max_len=64)
    small.reserve(100)
    assert small.max_len == 128
    small.reserve(600)
    assert small.max_len == 640  # doubling stops at the context
    small.reserve(700)
    assert small.max_len == 704  # a forward that needs more still gets it
    monkeypatch.setattr(fast, "free_device_memory", lambda device: 4096)
    with pytest.raises(EagleSpecError, match=r"static KV cache \[4, 2, 2, 129, 8\] in float32 needs \d+ bytes"):
        fast.FastTarget(model, max_len=128)
