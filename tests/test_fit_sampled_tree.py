"""bench/fit_sampled_tree.py: a sampled static tree fitted to the sibling-acceptance curve."""

from __future__ import annotations

import json

import pytest

from conftest import bench_module


def _curve_file(tmp_path, curve):
    row = {f"rrs{j + 1}_mc": a for j, a in enumerate(curve)}
    path = tmp_path / "t1.json"
    path.write_text(json.dumps({"chain_t1": {"by_depth": [row]}}))
    return str(path)


def test_sibling_table_takes_the_curve_steps():
    """P(the r-th draw accepted) = a(r+1) - a(r): a cumulative curve used as is (the classic slip) would give
    the second draw 0.7, more than the first; Monte-Carlo dips are clipped to a non-decreasing curve."""
    fit = bench_module("fit_sampled_tree")
    assert fit.sibling_table([0.5, 0.7, 0.8], 2, 4) == [[0.5, pytest.approx(0.2), pytest.approx(0.1), 0.0]] * 2
    assert fit.sibling_table([0.5, 0.49, 0.6], 1, 3) == [[0.5, 0.0, pytest.approx(0.1)]]


def test_fit_writes_a_tree_tree_sweep_drafts(tmp_path):
    fit, sweep = bench_module("fit_sampled_tree"), bench_module("tree_sweep")
    out_path = tmp_path / "fit.json"
    out = fit.main(["--curve", _curve_file(tmp_path, [0.5, 0.7, 0.8]), "--depth", "2", "--budget", "3",
                    "--json", str(out_path)])
    # values: (0) 0.5, (0,0) 0.25, (1) 0.2, (0,1) 0.1, (2) 0.1 ...: the best three, parents first
    assert out["tree"] == [[0], [0, 0], [1]]
    assert out["expected_tau"] == pytest.approx(1.95)
    assert sweep.fitted_choices(str(out_path), None) == ((0,), (0, 0), (1,))
    assert out["eagle1"]["3"]["nodes"] == 20


def test_bad_curve_file_is_a_one_line_error(tmp_path):
    fit = bench_module("fit_sampled_tree")
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    with pytest.raises(SystemExit, match=r"not a bench/t1_acceptance\.py --json"):
        fit.read_curve(str(bad))


def test_a_fitted_trees_budget_cut_sets_the_depth():
    """static:fit/BUDGET drafts the fitted tree's first BUDGET paths, and only as deep as they reach (a depth taken
    from the whole list would run drafter steps no kept node needs)."""
    sweep = bench_module("tree_sweep")
    fitted = ((0,), (1,), (0, 0), (2,), (0, 0, 0))
    spec = sweep.static_config({"fit": True, "budget": 4}, fitted)
    assert (spec.depth, spec.static_choices()) == (2, ((0,), (1,), (0, 0), (2,)))
    assert sweep.static_config({"fit": True, "budget": 5}, fitted).depth == 3


def test_round_timeline_drafts_the_tree_tree_sweep_drafts(tmp_path):
    """The two benchmarks read a fitted tree through one helper (tree_fit.load_fitted / fitted_spec): the same
    budget gives the same drafted tree, and a file without a tree is a one-line error naming it."""
    sweep, timeline = bench_module("tree_sweep"), bench_module("round_timeline")
    path = tmp_path / "fit.json"
    path.write_text(json.dumps({"tree": [[0], [1], [0, 0], [2], [0, 0, 0]]}))
    for budget in (1, 3, 4, 5):
        a = sweep.static_config({"fit": True, "budget": budget}, sweep.fitted_choices(str(path), None))
        b = timeline.fitted_spec(str(path), budget)
        assert (a.depth, a.static_choices()) == (b.depth, b.static_choices())
    assert timeline.fitted_spec(str(path), None).budget == 5
    (tmp_path / "bad.json").write_text(json.dumps({"tree": []}))
    for bad, why in (("bad.json", "empty"), ("none.json", "no fitted tree")):
        for read in (lambda p: sweep.fitted_choices(p, None), lambda p: timeline.fitted_spec(p, 2)):
            with pytest.raises(SystemExit, match=f"--fit-json .*{bad}.*{why}"):
                read(str(tmp_path / bad))
