"""Adaptive speculation (gate.py, SpeculativeEngine(adaptive=True)): the gate's choice from measured times, and
rounds that mix plain steps with drafted rounds staying exact: greedy output identical to HF generate (chain,
static and dynamic trees, HF and fast targets, static draft runner) and, under sampling, the target's
distribution of the first three tokens."""

from __future__ import annotations

import pytest
import torch

import eaglespec.engine.loop as engine_mod
from _engines import enable_draft_graphs
from eaglespec.backends.fast import FastTarget
from eaglespec.backends.hf import HFTarget
from eaglespec.engine.gate import SpeculationGate
from eaglespec.engine.loop import SpeculativeEngine
from eaglespec.sampling import SamplingConfig, SamplingParams
from eaglespec.tree.core import TreeSpec
from test_sampling_engine import PROMPT, _exact_first3, first3_pvalue, sharp_target  # noqa: F401 (fixture)

from conftest import reference_greedy, tiny_drafter, tiny_target


def run_gate(gate: SpeculationGate, draft_s: float, plain_s: float, draft_tokens: int, rounds: int) -> list[bool]:
    """Drive a gate with constant per-mode costs; returns the modes it chose."""
    modes = []
    for _ in range(rounds):
        d = gate.draft()
        modes.append(d)
        gate.record(d, draft_tokens if d else 1, draft_s if d else plain_s)
    return modes


def test_gate_settles_on_the_faster_mode_and_keeps_probing():
    slow_drafts = run_gate(SpeculationGate(warmup=3, probe=3, every=20, window=8), 0.010, 0.002, 3, 200)
    assert slow_drafts[:3] == [True] * 3 and slow_drafts[3:6] == [False] * 3  # warm-up, then a probe of plain
    assert sum(slow_drafts[6:]) / len(slow_drafts[6:]) < 0.2  # plain most of the time (3 tokens / 10 ms < 1 / 2 ms)
    assert any(slow_drafts[50:])  # drafting is still probed now and then
    fast_drafts = run_gate(SpeculationGate(warmup=3, probe=3, every=20, window=8), 0.004, 0.002, 3, 200)
    assert sum(fast_drafts[6:]) / len(fast_drafts[6:]) > 0.8  # 3 tokens / 4 ms beat 1 / 2 ms
    assert not all(fast_drafts[6:])  # plain is still probed


def test_gate_ignores_the_first_round_after_a_switch():
    gate = SpeculationGate(warmup=2, probe=2, every=10, window=4)
    gate.record(True, 3, 100.0)  # the very first round (graph captures...): not timed
    gate.record(True, 3, 0.003)
    assert gate.seconds_per_token(True) == pytest.approx(0.001)
    assert not gate.draft()  # the probe of plain steps starts
    gate.record(False, 1, 100.0)  # first plain step: not timed
    gate.record(False, 1, 0.002)
    assert gate.seconds_per_token(False) == pytest.approx(0.002)
    assert gate.draft() and gate.switches == 2  # drafting is faster per token: back to it


def test_gate_rejects_bad_settings_and_records():
    with pytest.raises(ValueError, match=">= 1"):
        SpeculationGate(probe=0)
    gate = SpeculationGate()
    with pytest.raises(ValueError, match="draft"):
        gate.record(False, 1, 0.1)


def run_arms(gate: SpeculationGate, seconds: dict[int, float], rounds: int) -> list[int]:
    """Drive a gate whose arms cost `seconds[arm]` per round, one token each; returns the arms it chose."""
    arms = []
    for _ in range(rounds):
        a = gate.arm()
        arms.append(a)
        gate.record(a, 1, seconds[a])
    return arms


@pytest.mark.parametrize("best", [0, 2, 5])
def test_gate_climbs_the_depths_to_the_fastest_arm(best):
    """Arms 0..5 with seconds per token growing with the distance from `best`: from the deepest arm the gate
    moves one depth at a time to `best`, stays there, and keeps probing its neighbours less and less often."""
    seconds = {a: 1.0 + 0.1 * abs(a - best) for a in range(6)}
    gate = SpeculationGate(warmup=2, probe=2, every=16, window=4, arms=range(6))
    arms = run_arms(gate, seconds, 400)
    assert arms[0] == 5
    assert sorted(set(arms[:60])) == list(range(max(best - 1, 0), 6))  # the climb never skips a depth
    late = arms[100:]
    assert late.count(best) / len(late) > 0.8 and set(late) <= {best - 1, best, best + 1}
    assert gate.interval > gate.every  # probes that confirm back off


def test_gate_with_one_arm_never_switches():
    gate = SpeculationGate(warmup=1, probe=1, every=2, window=2, arms=(3,))
    assert set(run_arms(gate, {3: 0.1}, 50)) == {3} and gate.switches == 0
    with pytest.raises(ValueError, match="depths"):
        SpeculationGate(arms=())


class Pattern(SpeculationGate):
    """A gate that follows a fixed, repeating pattern of modes (to force mixing in tests)."""

    def __init__(self, pattern: tuple[bool, ...]):
        super().__init__()
        self.pattern, self.i = pattern, 0

    def draft(self) -> bool:
        return self.pattern[self.i % len(self.pattern)]

    def record(self, drafted: bool, tokens: int, seconds: float) -> None:
        assert drafted == self.draft()
        self.i += 1


SPECS = {"chain": TreeSpec("chain", depth=3), "static": TreeSpec("static", depth=3, top_k=4, budget=8),
         "dynamic": TreeSpec("dynamic", depth=3, top_k=3, budget=6)}


@pytest.mark.parametrize("backend", ["hf", "fast"])
@pytest.mark.parametrize("kind", list(SPECS))
def test_mixed_rounds_stay_greedy_exact(monkeypatch, kind, backend):
    """Plain steps between drafted rounds (runs of 1 and 3): the output stays HF generate's (a wrong commit or a
    token queued twice would change it; what the drafter sees is checked by the next test)."""
    model = tiny_target("llama", seed=3)
    drafter = tiny_drafter(model, seed=1)
    target = HFTarget(model) if backend == "hf" else FastTarget(model, max_len=128)
    pattern = (True, False, True, False, False, False, True, True)
    monkeypatch.setattr(engine_mod, "SpeculationGate", lambda: Pattern(pattern))
    engine = SpeculativeEngine(target, drafter, SPECS[kind], adaptive=True)
    ref = SpeculativeEngine(HFTarget(model), drafter, SPECS[kind])  # always drafting: the same drafts per round
    if backend == "fast":
        enable_draft_graphs(engine, max_len=128)
    for prompt in ([4, 8, 15, 16, 23, 42], [7, 1]):
        out = engine.generate(prompt, 30)
        assert out.token_ids == reference_greedy(model, prompt, 30) == ref.generate(prompt, 30).token_ids
        drafted = [r.drafted > 0 for r in out.rounds]
        assert drafted[:8] == [p for p in pattern]  # the gate's choices were followed
        assert isinstance(engine.gate, Pattern)


def test_adaptive_off_never_makes_a_gate():
    model = tiny_target("llama", seed=3)
    engine = SpeculativeEngine(HFTarget(model), tiny_drafter(model, seed=1), SPECS["chain"])
    engine.generate([1, 2, 3], 5)
    assert engine.gate is None
    plain = SpeculativeEngine(HFTarget(model), None, TreeSpec("chain", depth=0), adaptive=True)
    assert plain.generate([1, 2, 3], 5).token_ids == reference_greedy(model, [1, 2, 3], 5)
    assert plain.gate is None  # nothing to gate without a drafter


def test_mixed_rounds_keep_the_target_distribution(sharp_target, monkeypatch):  # noqa: F811
    """Sampling, T=1 top-k 5: rounds alternate plain / drafted from the first one; the first three tokens
    follow the target's distribution (and the check can tell another temperature apart)."""
    monkeypatch.setattr(engine_mod, "SpeculationGate", lambda: Pattern((False, True)))
    params = SamplingParams(temperature=1.0, top_k=5)
    engine = SpeculativeEngine(HFTarget(sharp_target), tiny_drafter(sharp_target, seed=1),
                               TreeSpec("chain", depth=1), adaptive=True)
    tokens = [engine.generate(PROMPT, 3, sampling=SamplingConfig(params, seed=s)).token_ids for s in range(1500)]
    emitted = torch.tensor(tokens)
    p, impossible = first3_pvalue(emitted, _exact_first3(sharp_target, params))
    assert impossible == 0 and p > 1e-3, f"mixed rounds are not the target's distribution (p = {p:.2e})"
    p_other, _ = first3_pvalue(emitted, _exact_first3(sharp_target, SamplingParams(temperature=0.6)))
    assert p_other < 1e-3


@pytest.mark.parametrize("kind", ["chain", "dynamic"])
def test_drafts_after_plain_steps_see_every_token(monkeypatch, kind):
    """The tree drafted right after plain steps equals the first tree of a fresh run whose prompt is the text so
    far (whose drafter caught up over all of it in its prefill): the plain steps' tokens and features reached
    the drafter, each once and in order (dropping them, or queueing one twice, gives other trees)."""
    model = tiny_target("llama", seed=3)
    drafter = tiny_drafter(model, seed=1)
    monkeypatch.setattr(engine_mod, "SpeculationGate", lambda: Pattern((True, False, False, True, False, True)))
    engine = SpeculativeEngine(HFTarget(model), drafter, SPECS[kind], adaptive=True)
    trees = []
    orig = engine.proposer.propose
    engine.proposer.propose = lambda *a: trees.append(orig(*a)) or trees[-1]
    prompt = [4, 8, 15, 16, 23, 42]
    out = engine.generate(prompt, 24)
    drafted_rounds = [i for i, r in enumerate(out.rounds) if r.drafted > 0]
    checked = 0
    for n_tree, i in enumerate(drafted_rounds):
        if i == 0 or out.rounds[i - 1].drafted > 0:
            continue  # only the trees drafted right after a plain step
        prefix = prompt + out.token_ids[: 1 + sum(r.emitted for r in out.rounds[:i])]
        fresh = SpeculativeEngine(HFTarget(model), drafter, SPECS[kind])
        first = []
        orig_fresh = fresh.proposer.propose
        fresh.proposer.propose = lambda *a, _o=orig_fresh, _f=first: _f.append(_o(*a)) or _f[-1]
        fresh.generate(prefix[:-1], 2)  # its prefill emits prefix[-1] (greedy), then it drafts from there
        assert torch.equal(first[0].tokens, trees[n_tree].tokens) and torch.equal(first[0].parents,
                                                                                   trees[n_tree].parents)
        torch.testing.assert_close(first[0].logq, trees[n_tree].logq, rtol=1e-4, atol=1e-4)
        checked += 1
    assert checked >= 2


def settled_runs(modes: list[bool]) -> list[tuple[bool, int]]:
    """(mode, length) of each run of equal modes."""
    runs: list[tuple[bool, int]] = []
    for m in modes:
        if runs and runs[-1][0] == m:
            runs[-1] = (m, runs[-1][1] + 1)
        else:
            runs.append((m, 1))
    return runs


def test_gate_backs_off_while_probes_confirm():
    """Drafting keeps losing: every probe of it confirms plain steps, so the settled stretches between probes
    double (every, 2 every, ...) up to max_every, and the probes stay `probe` rounds long."""
    gate = SpeculationGate(warmup=2, probe=2, every=4, window=4, max_every=32)
    runs = settled_runs(run_gate(gate, 0.010, 0.002, 3, 400))
    assert runs[0] == (True, 2)  # warm-up
    # the first probe of plain steps settles on them: the plain run is that probe (2) + a settled stretch (4)
    plain = [n for m, n in runs if not m]
    assert plain[:6] == [2 + 4, 8, 16, 32, 32, 32]
    assert all(n == 2 for m, n in runs[1:-1] if m)  # each drafting probe: `probe` rounds
    assert gate.interval == 32


def test_gate_backoff_resets_when_a_probe_flips_the_mode():
    """The costs change mid-text: plain steps win for a while (backing off), then drafting gets cheap; the probe
    that finds it switches to drafting at once and the interval is back to `every`, growing again from there."""
    gate = SpeculationGate(warmup=2, probe=2, every=4, window=2, max_every=64)
    modes = run_gate(gate, 0.010, 0.002, 3, 100)  # drafting slow: backing off
    assert gate.interval == 64 and not gate.draft()
    modes = run_gate(gate, 0.001, 0.002, 3, 400)  # drafting fast from now on
    runs = settled_runs(modes)
    first_draft = next(i for i, (m, _) in enumerate(runs) if m)
    # the drafting probe flips the mode: it runs probe (2) + every (4) rounds, then plain is probed (2 rounds,
    # confirming drafting) and the stretches double again
    assert [n for m, n in runs[first_draft:] if m][:5] == [2 + 4, 8, 16, 32, 64]
    assert all(n == 2 for m, n in runs[first_draft + 1: -1] if not m)
    assert gate.interval == 64 and gate.draft()


def test_gate_rejects_a_cap_below_the_base_interval():
    with pytest.raises(ValueError, match="max_every"):
        SpeculationGate(every=64, max_every=32)
