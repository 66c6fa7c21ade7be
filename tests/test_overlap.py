"""Overlap (engine.overlap, EngineConfig.overlap): the next round graph or plain step is launched before the host
reads the tokens of the one before it. On CPU every op runs as it is called, so these tests check what the GPU
relies on: the same tokens, trees and committed KV as one round at a time (greedy and seeded sampling), the
launched round used only by the next call of its own stream, no launch past the last round by length, one unused
launch after an EOS, a clean state for the next stream after an EOS or a consumer that stops early, and the same
error at the same round when a launch cannot be made."""

from __future__ import annotations

import pytest
import torch

from eaglespec.backends.fast import FastTarget
from eaglespec.backends.hf import HFTarget
from eaglespec.engine.loop import SpeculativeEngine
from eaglespec.engine.round_graph import RoundGraph
from eaglespec.errors import EagleSpecError
from eaglespec.sampling import SamplingConfig, SamplingParams
from test_draft_static import agreeing
from test_round_graph import PROMPTS, SPECS, _trees, count_bodies, engines

from conftest import reference_greedy


@pytest.fixture(scope="module", params=[("llama", "eagle3"), ("llama", "eagle1")], ids=["eagle3", "eagle1"])
def pair(request):
    return agreeing(*request.param)


def graph_like(rg: RoundGraph) -> None:
    """Make rg's rounds return the same output tensors every time, as a replayed CUDA graph does (on CPU the body
    returns fresh ones): a round launched ahead then overwrites what the host has not copied yet."""
    run, static = rg._run, {}

    def replayed(span_d, span_t, sampling, capture=True):
        res, logq = run(span_d, span_t, sampling, capture)
        out = static.setdefault((res.shape, logq.shape), (torch.empty_like(res), torch.empty_like(logq)))
        out[0].copy_(res)
        out[1].copy_(logq)
        return out

    rg._run = replayed


def overlapped(model, drafter, spec) -> tuple[SpeculativeEngine, SpeculativeEngine]:
    """(round graphs one round at a time, round graphs with overlap), both with graph-like outputs."""
    _, one = engines(model, drafter, spec)
    _, two = engines(model, drafter, spec)
    for engine, on in ((one, False), (two, True)):
        engine.overlap = engine.graphs.overlap = on
    graph_like(one.graphs.get(one.spec))
    graph_like(two.graphs.get(two.spec))
    return one, two


def count_launches(rg: RoundGraph) -> list[str]:
    """Wrap rg._launch: each launch's kind, "fresh" (the round the host is about to read), "next" (the next round,
    launched before this round's bookkeeping) or "ahead" (the one after it, queued behind a round not read yet)."""
    kinds: list[str] = []
    launch, top_up, inside = rg._launch, rg._launch_next, []

    def launched(sampling, n, dlen, tlen, ahead=False):
        kinds.append("ahead" if ahead else "next" if inside else "fresh")
        return launch(sampling, n, dlen, tlen, ahead)

    def topped(*args):
        inside.append(1)
        try:
            return top_up(*args)
        finally:
            inside.pop()

    rg._launch, rg._launch_next = launched, topped
    return kinds


@pytest.mark.parametrize("kind", list(SPECS))
def test_overlap_gives_the_rounds_of_one_at_a_time(pair, kind):
    """HF generate's tokens, the same trees and accepted rows, the same committed KV; every round a graph (the
    drafter's prefill leaves the first round at most P pending rows), every one after the first launched before
    the host read the round before it, most of them behind a round not read yet (two in
    flight), and none was launched past the last round (the stream ends by length). Each round's draft
    log-probabilities are its own (the per-phase rounds' to float rounding), not the next rounds'."""
    model, drafter = pair
    one, two = overlapped(model, drafter, SPECS[kind])
    phased, _ = engines(model, drafter, SPECS[kind])
    bodies = count_bodies(two.graphs.get(two.spec))
    kinds = count_launches(two.graphs.get(two.spec))
    rounds = 0
    for prompt in PROMPTS:
        ref = reference_greedy(model, prompt, 40)
        a, b, c = one.generate(prompt, 40), two.generate(prompt, 40), phased.generate(prompt, 40)
        rounds += len(b.rounds)
        assert a.token_ids == b.token_ids == c.token_ids == ref
        assert _trees(a) == _trees(b) == _trees(c)
        for ra, rb in zip(c.rounds, b.rounds):
            torch.testing.assert_close(rb.detail["logq"], ra.detail["logq"], rtol=1e-5, atol=1e-5)
        n = one.target.committed_len
        assert n == two.target.committed_len
        torch.testing.assert_close(two.target.cache[:, :, :, :n], one.target.cache[:, :, :, :n])
        d = one.proposer.committed
        assert d == two.proposer.committed
        for ka, kb in zip(one.proposer.runner.k + one.proposer.runner.v,
                          two.proposer.runner.k + two.proposer.runner.v):
            torch.testing.assert_close(kb[:, :, :d], ka[:, :, :d])
    # per stream: the drafter's prefill took the prompt (all but P rows), so every round is a graph: the first
    # launched fresh, the rest next / ahead; none wasted
    assert len(bodies) == len(kinds) == rounds
    assert kinds.count("fresh") == len(PROMPTS) and kinds.count("ahead") > 10


def test_the_second_round_in_flight_waits_where_the_cache_must_grow(pair):
    """A target cache that must grow mid-stream: a round queued behind an unread one never grows it (that round is
    launched from bounds, while another may still read the cache), so near the growth the engine falls back to one
    round in flight and grows it there; the tokens are HF generate's, the committed KV one round at a time's."""
    model, drafter = pair
    one, two = overlapped(model, drafter, SPECS["dynamic"])
    for engine in (one, two):
        engine.target._allocate(24)  # 64 slots (whole spans), below prompt + 80 new tokens + tree rows: it grows
    rg = two.graphs.get(two.spec)
    kinds = count_launches(rg)
    grown, launch = [], rg._launch

    def watched(*args, **kwargs):
        before = two.target.max_len
        out = launch(*args, **kwargs)
        if two.target.max_len != before:
            grown.append(kinds[-1])
        return out

    rg._launch = watched
    ref = reference_greedy(model, PROMPTS[1], 80)
    assert one.generate(PROMPTS[1], 80).token_ids == two.generate(PROMPTS[1], 80).token_ids == ref
    n = one.target.committed_len
    torch.testing.assert_close(two.target.cache[:, :, :, :n], one.target.cache[:, :, :, :n])
    assert two.target.max_len > 64 and "ahead" in kinds
    assert grown and "ahead" not in grown  # every growth came from a launch with nothing queued behind it




def test_overlap_with_seeded_sampling_draws_the_same_numbers(pair):
    """The launch ahead draws the next round's random numbers where the round itself would: same seed, same tokens."""
    model, drafter = pair
    cfg = SamplingConfig(SamplingParams(temperature=0.9, top_k=20), seed=11)
    for kind in ("chain", "dynamic"):
        one, two = overlapped(model, drafter, SPECS[kind])
        bodies = count_bodies(two.graphs.get(two.spec))
        kinds = count_launches(two.graphs.get(two.spec))
        for prompt in PROMPTS:
            a, b = one.generate(prompt, 40, sampling=cfg), two.generate(prompt, 40, sampling=cfg)
            assert a.token_ids == b.token_ids and len(a.token_ids) == 40, kind
            assert _trees(a) == _trees(b), kind
        assert bodies and len(kinds) == len(bodies), kind
        assert kinds.count("fresh") == len(PROMPTS) and "ahead" in kinds, kind


def test_eos_leaves_one_unused_launch_and_a_clean_next_stream(pair):
    model, drafter = pair
    _, two = overlapped(model, drafter, SPECS["chain"])
    bodies = count_bodies(two.graphs.get(two.spec))
    ref = reference_greedy(model, PROMPTS[1], 30)
    eos = ref[17]
    out = two.generate(PROMPTS[1], 30, eos_token_ids=[eos])
    assert out.token_ids == ref[: ref.index(eos) + 1] and out.finish_reason == "stop"
    # every round a graph (the drafter's prefill took the prompt); the round that found the EOS launched nothing
    # (its own tokens hold it), but the round after it was queued behind it before the host read it: one unused
    # body past the last round
    assert len(bodies) == len(out.rounds) + 1
    for prompt in PROMPTS:  # the next streams start from their own prefill, whatever was launched before
        for new in (1, 2, 7, 33):
            assert two.generate(prompt, new).token_ids == reference_greedy(model, prompt, new)


def test_a_consumer_that_stops_early_leaves_its_launch_unused(pair):
    """A stream abandoned after 3 rounds has a round in flight; the next stream must not take it, also when its
    first round is a round graph (every first round is one, after the drafter's prefill; a prompt of at most
    depth + 1 tokens needs no prefill)."""
    model, drafter = pair
    _, two = overlapped(model, drafter, SPECS["dynamic"])
    rg = two.graphs.get(two.spec)
    stream = two.stream(PROMPTS[0], 60)
    for _ in range(4):
        next(stream)
    stream.close()
    assert len(rg._flight) == 2  # launched, never read
    for prompt in ([5, 9, 2], PROMPTS[0], PROMPTS[1]):
        assert two.generate(prompt, 30).token_ids == reference_greedy(model, prompt, 30)


def test_a_launch_that_raises_raises_at_the_round_that_needs_it(pair, monkeypatch):
    """No room for the next round: overlap yields the same tokens, then the same error, as one round at a time."""
    model, drafter = pair
    seen = []
    for engine in overlapped(model, drafter, SPECS["chain"]):
        rg = engine.graphs.get(engine.spec)
        launch, calls = rg._launch, []

        def failing(*args, launch=launch, calls=calls, **kwargs):
            calls.append(1)
            if len(calls) >= 3:
                raise EagleSpecError("no room for the next round")
            return launch(*args, **kwargs)

        monkeypatch.setattr(rg, "_launch", failing)
        got = []
        with pytest.raises(EagleSpecError, match="no room"):
            for tokens in engine.stream(PROMPTS[1], 40):
                got.append(tokens)
        seen.append(got)
    assert seen[0] == seen[1] and len(seen[0]) == 3  # the prefill's token and rounds 1-2 (every round is launched)


@pytest.mark.parametrize("target_kind", ["fast", "hf"])
def test_plain_decoding_overlap(pair, target_kind):
    """Plain steps: the next forward launched before the token is read; same tokens as HF generate (greedy and
    seeded sampling as without overlap), no forward past max_new_tokens, one unused forward after an EOS."""
    model, _ = pair
    engines_ = []
    for on in (False, True):
        target = FastTarget(model, max_len=128) if target_kind == "fast" else HFTarget(model)
        engine = SpeculativeEngine(target, None)
        engine.overlap = on
        engines_.append(engine)
    one, two = engines_
    calls = []
    forward = two.target.forward
    two.target.forward = lambda *a, **k: calls.append(1) or forward(*a, **k)
    for new in (1, 2, 3, 17):
        calls.clear()
        assert two.generate(PROMPTS[0], new).token_ids == reference_greedy(model, PROMPTS[0], new)
        assert len(calls) == new  # the prefill and new - 1 steps
    ref = reference_greedy(model, PROMPTS[1], 20)
    eos = ref[9]
    calls.clear()
    out = two.generate(PROMPTS[1], 20, eos_token_ids=[eos])
    assert out.token_ids == ref[: ref.index(eos) + 1]
    assert len(calls) == len(out.token_ids) + 1  # the prefill, the steps, one launched past the EOS
    assert two.generate(PROMPTS[0], 9).token_ids == reference_greedy(model, PROMPTS[0], 9)
    cfg = SamplingConfig(SamplingParams(temperature=1.0), seed=4)
    assert one.generate(PROMPTS[1], 25, sampling=cfg).token_ids == two.generate(PROMPTS[1], 25,
                                                                                  sampling=cfg).token_ids


def test_adaptive_streams_launch_nothing_ahead(pair):
    """The gate may take a plain step next: a speculative round never launches the next one under --adaptive."""
    model, drafter = pair
    _, two = overlapped(model, drafter, SPECS["chain"])
    two.adaptive = True
    kinds = count_launches(two.graphs.get(two.spec))
    for prompt in PROMPTS:
        assert two.generate(prompt, 40).token_ids == reference_greedy(model, prompt, 40)
    assert kinds and set(kinds) == {"fresh"} and two._plain_ahead is None



