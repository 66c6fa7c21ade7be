"""eaglespec.tree.sampled_fit: the sibling-acceptance curve, and the sampled static tree fitted to it; reading and
cutting a fitted tree file (eaglespec.tree.fit.load_fitted / fitted_spec)."""

from __future__ import annotations

import json

import pytest
import torch

from eaglespec.errors import EagleSpecError
from eaglespec.tree import fit as tree_fit
from eaglespec.tree.sampled_fit import fit_sampled_tree, read_curve, sibling_acceptance, sibling_table


def _curve(pd: list[float], q: list[float], n: int, rows: int = 128) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    out = sibling_acceptance(torch.tensor([pd] * rows), torch.tensor([q] * rows), n, gen)
    assert out.shape == (rows, n)
    return out.mean(0)


def test_curve_is_cumulative_over_the_draw_order():
    """p a point mass on token 0, q uniform over 4 tokens: the draft is accepted once token 0 is drawn, so with j
    siblings the rate is j/4 (a per-sibling share would read 1/4 for every j); a fifth sibling cannot be drawn
    (q has 4 tokens) and keeps the rate at 1."""
    curve = _curve([1.0, 0.0, 0.0, 0.0], [0.25] * 4, 5)
    assert curve.tolist() == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0], abs=0.04)


def test_curve_counts_mass_outside_the_draft_vocabulary():
    """Half of p lies outside the draft vocabulary (q = 0 there): one sibling drawing token 0 is accepted with
    min(1, p/q) = 0.5, and nothing else can be drawn. p = q on the vocabulary gives 1 at once."""
    assert _curve([0.5, 0.0, 0.0], [1.0, 0.0, 0.0], 3).tolist() == pytest.approx([0.5, 0.5, 0.5], abs=0.05)
    assert _curve([0.2, 0.3, 0.5], [0.2, 0.3, 0.5], 2).tolist() == pytest.approx([1.0, 1.0], abs=1e-6)


def _curve_file(tmp_path, curve):
    row = {f"rrs{j + 1}_mc": a for j, a in enumerate(curve)}
    path = tmp_path / "t1.json"
    path.write_text(json.dumps({"chain_t1": {"by_depth": [row]}}))
    return str(path)


def test_sibling_table_takes_the_curve_steps():
    """P(the r-th draw accepted) = a(r+1) - a(r): the cumulative curve used as is would give the second draw 0.7,
    more than the first; Monte-Carlo dips are clipped to a non-decreasing curve."""
    assert sibling_table([0.5, 0.7, 0.8], 2, 4) == [[0.5, pytest.approx(0.2), pytest.approx(0.1), 0.0]] * 2
    assert sibling_table([0.5, 0.49, 0.6], 1, 3) == [[0.5, 0.0, pytest.approx(0.1)]]


def test_fit_takes_the_best_nodes_parents_first(tmp_path):
    out = fit_sampled_tree(read_curve(_curve_file(tmp_path, [0.5, 0.7, 0.8])), depth=2, budget=3, width=10)
    # values: (0) 0.5, (0,0) 0.25, (1) 0.2, (0,1) 0.1, (2) 0.1 ...: the best three, parents first
    assert out["tree"] == [[0], [0, 0], [1]]
    assert out["expected_tau"] == pytest.approx(1.95)
    assert out["eagle1"]["3"]["nodes"] == 20
    path = tmp_path / "fit.json"
    path.write_text(json.dumps(out))
    assert tree_fit.load_fitted(path) == ((0,), (0, 0), (1,))  # what tree_sweep / round_timeline --fit-json read


def test_bad_curve_file_and_sizes_are_one_line_errors(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    with pytest.raises(EagleSpecError, match=r"x\.json: not a sibling-acceptance curve file"):
        read_curve(bad)
    bad.write_text(json.dumps({"chain_t1": {"by_depth": [{"beta": 0.5}]}}))
    with pytest.raises(EagleSpecError, match="no rrs1_mc"):
        read_curve(bad)
    with pytest.raises(EagleSpecError, match="budget must be >= 1"):
        fit_sampled_tree([0.5], depth=2, budget=0, width=4)


def test_a_fitted_trees_budget_cut_sets_the_depth():
    """A fitted tree's first BUDGET paths are drafted only as deep as they reach (a depth taken from the whole list
    would run drafter steps no kept node needs); no budget keeps the whole tree."""
    fitted = ((0,), (1,), (0, 0), (2,), (0, 0, 0))
    spec = tree_fit.fitted_spec(fitted, 4)
    assert spec.kind == "static" and (spec.depth, spec.budget) == (2, 4)
    assert spec.static_choices() == ((0,), (1,), (0, 0), (2,))
    assert tree_fit.fitted_spec(fitted, 5).depth == 3
    assert tree_fit.fitted_spec(fitted, None).budget == 5


def test_fitted_tree_files_that_hold_no_tree_are_one_line_errors(tmp_path):
    (tmp_path / "empty.json").write_text(json.dumps({"tree": []}))
    (tmp_path / "curve.json").write_text(json.dumps({"curve": [0.5]}))
    for name, why in (("empty.json", "empty"), ("curve.json", "no fitted tree.*KeyError"),
                      ("none.json", "no fitted tree")):
        with pytest.raises(EagleSpecError, match=f"{name}.*{why}"):
            tree_fit.load_fitted(tmp_path / name)
