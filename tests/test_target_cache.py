"""The default target's cache: a conversion saved without weights (as transformers does on a non-zero
torch.distributed rank) is refused, a lost rename race uses the winner's copy, a stale incomplete cache is
rebuilt, and `train` resolves the target before it joins a process group. No network, no GGUF."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from eaglespec.backends import loading
from eaglespec.errors import EagleSpecError

from conftest import BYTE_VOCAB, byte_tokenizer, tiny_target


@pytest.fixture
def fake_gguf(tmp_path, monkeypatch):
    """The cache under tmp_path; the GGUF conversion replaced by a tiny model + byte tokenizer. -> `out`."""
    import transformers

    monkeypatch.setenv("EAGLESPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(loading, "smollm2_gguf", lambda: tmp_path / "fake.gguf")
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: byte_tokenizer())
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **k: tiny_target(vocab=BYTE_VOCAB, layers=1))
    major = transformers.__version__.split(".")[0]
    return tmp_path / "cache" / "targets" / f"{loading.DEFAULT_TARGET}-transformers{major}"


def _leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name != out.name) if out.parent.exists() else []


def test_save_without_weights_is_refused(fake_gguf, monkeypatch):
    """transformers 5 saves nothing but the directory on a non-zero rank: refuse it, leave no cache behind."""
    import transformers

    def no_save(self, save_directory, **kwargs):
        os.makedirs(save_directory, exist_ok=True)

    monkeypatch.setattr(transformers.LlamaForCausalLM, "save_pretrained", no_save)
    with pytest.raises(EagleSpecError, match=r"lacks config\.json") as exc:
        loading.default_target_dir()
    assert str(fake_gguf) in str(exc.value) and "\n" not in str(exc.value)
    assert not fake_gguf.exists() and _leftovers(fake_gguf) == []


def test_lost_rename_race_uses_the_winner(fake_gguf, monkeypatch):
    """Another process renames its complete copy into place just before ours: use it, drop our tmp."""
    real_replace = Path.replace

    def racing_replace(self, target):
        if Path(target) == fake_gguf and not fake_gguf.exists():
            shutil.copytree(self, fake_gguf)  # the other process wins
        return real_replace(self, target)

    monkeypatch.setattr(Path, "replace", racing_replace)
    assert loading.default_target_dir() == fake_gguf
    assert (fake_gguf / "config.json").is_file() and _leftovers(fake_gguf) == []


def test_incomplete_cache_is_rebuilt(fake_gguf):
    """A cache left with only tokenizer files (as rank 1 once made it) is converted again, not returned."""
    fake_gguf.mkdir(parents=True)
    byte_tokenizer().save_pretrained(fake_gguf)
    assert loading.default_target_dir() == fake_gguf
    assert (fake_gguf / "config.json").is_file() and any(fake_gguf.glob("*.safetensors"))
    assert _leftovers(fake_gguf) == []


def test_complete_cache_is_reused(fake_gguf, monkeypatch):
    import transformers

    assert loading.default_target_dir() == fake_gguf

    def fail(*a, **k):
        raise AssertionError("converted again")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fail)
    assert loading.default_target_dir() == fake_gguf


def test_train_resolves_the_target_before_init_distributed(tmp_path, monkeypatch):
    from eaglespec.cli.main import build_parser
    from eaglespec.cli.train import cmd_train
    from eaglespec.train import trainer

    class Stop(Exception):
        pass

    calls: list[tuple] = []

    def resolve(name):
        calls.append(("resolve", name))
        return "/resolved/target"

    def init(device):
        calls.append(("init",))
        return device

    def load(name, **kwargs):
        calls.append(("load", name))
        raise Stop

    monkeypatch.setattr(loading, "resolve_target", resolve)
    monkeypatch.setattr(loading, "load_target", load)
    monkeypatch.setattr(trainer, "init_distributed", init)
    (tmp_path / "d.jsonl").write_text('{"conversations": [{"role": "user", "content": "hi"}]}\n')
    args = build_parser().parse_args(["train", "--data", str(tmp_path / "d.jsonl"), "--out", str(tmp_path / "o"),
                                      "--device", "cpu"])
    with pytest.raises(Stop):
        cmd_train(args)
    assert calls == [("resolve", None), ("init",), ("load", "/resolved/target")]
