"""Decontamination: training conversations that share a run of n words with an evaluation prompt are dropped.

Words are the runs of letters, digits and underscores of the lowercased text (`\\w+`), so case, punctuation and
spacing do not matter. A training text and an evaluation prompt overlap when both hold the same n consecutive words
(n = 13, the convention of the GPT-3 and Llama decontamination analyses). An evaluation prompt shorter than n words
overlaps a text that holds all its words in a row when it has at least 8 words (GPT-3's shortest n); shorter ones
("Can you parallelize it?") are common phrasing, not a leak, and are not checked. Each message of a conversation is
checked on its own.

    sets, missing = evaluation_sets("mtbench,humaneval")   # {name: prompts}; MT-bench with both turns
    kept, report = decontaminate(conversations, sets)
    report.line()  # "decontamination: dropped 3 of 1200 conversations sharing a 13-word run with an evaluation
                   #  prompt (mtbench 2, humaneval 1)"

A conversation is {"messages": [{"content": ...}, ...]} (train.data.read_conversations) or a plain string.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from eaglespec.datasets import DATASETS, MTBENCH, load_prompts, package_file
from eaglespec.errors import EagleSpecError

NGRAM = 13  # words in a shared run (GPT-3 / Llama decontamination)
MIN_WORDS = 8  # shorter evaluation prompts are not checked
DEFAULT_SETS = "mtbench,humaneval"
_WORD = re.compile(r"\w+")

Gram = tuple[str, ...]


def words(text: str) -> list[str]:
    """The lowercased words of `text` (runs of letters, digits and underscores)."""
    return _WORD.findall(text.lower())


def _windows(w: list[str], n: int) -> Iterable[Gram]:
    """Every run of n consecutive words of `w`, as tuples."""
    return zip(*(w[i:] for i in range(n)))


class NgramIndex:
    """The n-word runs of named evaluation prompt sets; match(text) -> the names of the sets `text` overlaps."""

    def __init__(self, sets: Mapping[str, Iterable[str]], n: int = NGRAM):
        if n < 1:
            raise EagleSpecError(f"decontamination n-gram length must be >= 1, got {n}")
        self.n, self.names = n, list(sets)
        self.shortest = min(n, MIN_WORDS)
        self.runs: dict[int, dict[Gram, int]] = {}  # run length (n, or a shorter prompt's) -> run -> bitmask of sets
        for bit, name in enumerate(self.names):
            for text in sets[name]:
                w = words(text)
                if len(w) < self.shortest:
                    continue
                k = min(n, len(w))
                table = self.runs.setdefault(k, {})
                for gram in _windows(w, k):
                    table[gram] = table.get(gram, 0) | (1 << bit)
        # the first `shortest` words of every run: a text without any of them (most texts) is clean after one pass
        self.heads = {gram[: self.shortest] for table in self.runs.values() for gram in table}

    def match(self, text: str) -> set[str]:
        """Names of the sets sharing a run with `text` (for most texts one set lookup per word decides: none)."""
        w = words(text)
        if len(w) < self.shortest or self.heads.isdisjoint(_windows(w, self.shortest)):
            return set()
        mask = 0
        for k, table in self.runs.items():
            if len(w) >= k:
                for gram in _windows(w, k):
                    mask |= table.get(gram, 0)
        return {name for bit, name in enumerate(self.names) if mask >> bit & 1}


def _texts(item: Any) -> list[str]:
    if isinstance(item, str):
        return [item]
    return [m["content"] for m in item["messages"]]


@dataclass
class Report:
    """What decontaminate dropped: `dropped` of `total` items; per set, the items overlapping it."""

    total: int
    dropped: int
    n: int
    by_set: dict[str, int] = field(default_factory=dict)
    prompts: dict[str, int] = field(default_factory=dict)  # prompts checked per set

    def line(self) -> str:
        if not self.by_set:
            return "decontamination: no evaluation prompt set to check against"
        per = ", ".join(f"{name} {count}" for name, count in self.by_set.items())
        return (f"decontamination: dropped {self.dropped} of {self.total} conversations sharing a {self.n}-word run "
                f"with an evaluation prompt ({per})")

    def to_dict(self) -> dict[str, Any]:
        return {"total": self.total, "dropped": self.dropped, "n": self.n, "by_set": dict(self.by_set),
                "prompts": dict(self.prompts)}


def decontaminate(items: Sequence[Any], sets: Mapping[str, Sequence[str]], n: int = NGRAM) -> tuple[list[Any], Report]:
    """`items` (conversations or strings) without those sharing an n-word run with any prompt of `sets`, in order;
    and the report (an item overlapping several sets counts once in `dropped` and once under each set)."""
    index = NgramIndex(sets, n)
    by_set = dict.fromkeys(sets, 0)
    kept = []
    for item in items:
        hit: set[str] = set()
        for text in _texts(item):
            hit |= index.match(text)
        if not hit:
            kept.append(item)
        for name in hit:
            by_set[name] += 1
    report = Report(len(items), len(items) - len(kept), n, by_set, {k: len(v) for k, v in sets.items()})
    return kept, report


def _mtbench_turns() -> list[str]:
    """Every turn of the 80 MT-bench questions (both are prompts the benchmark sends)."""
    path = package_file(*MTBENCH, "--exclude")
    return [t for line in path.read_text().splitlines() if line.strip() for t in json.loads(line)["turns"]]


def evaluation_sets(spec: str | None) -> tuple[dict[str, list[str]], list[str]]:
    """The prompt sets named in `spec` (comma-separated: mtbench, humaneval or prompt files; None: the default
    mtbench,humaneval; '' none) -> ({name: prompts}, the notes for the default sets skipped as not installed).
    A file that cannot be read is an error."""
    spec = DEFAULT_SETS if spec is None else spec
    sets: dict[str, list[str]] = {}
    missing = []
    for name in (s.strip() for s in spec.split(",") if s.strip()):
        try:
            sets[name] = _mtbench_turns() if name == "mtbench" else load_prompts(name, flag="--exclude")
        except EagleSpecError as exc:
            if name not in DATASETS:
                raise
            missing.append(f"not checking {name} ({exc})")
    return sets, missing
