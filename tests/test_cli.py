"""CLI: chat (piped stdin, multi-turn), report, serve; every flag has --help text."""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys

import pytest
import torch

from eaglespec import EagleSpec
from eaglespec.cli.chat import chat_loop
from eaglespec.cli.main import build_parser, main

from conftest import BYTE_VOCAB, byte_tokenizer, cycle_target, tiny_drafter, tiny_target

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny cycle model + byte tokenizer saved as a normal HF checkpoint directory."""
    d = tmp_path_factory.mktemp("cycle-model")
    tok = byte_tokenizer()
    model = cycle_target(tok)
    model.generation_config.eos_token_id = 2
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


def test_every_flag_has_help():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name in ("chat", "serve", "report"):
        p = sub.choices[name]
        for action in p._actions:
            assert action.help and action.help != argparse.SUPPRESS, f"{name} {action.option_strings}"
    assert sub.choices["serve"].parse_args([]).host == "127.0.0.1"


def test_chat_piped_stdin_multi_turn(model_dir):
    cmd = [sys.executable, "-m", "eaglespec.cli.main", "chat", "--target", str(model_dir), "--device", "cpu",
           "--max-new-tokens", "12"]
    r = subprocess.run(cmd, input="hello\n\n/reset\nagain é\n/exit\nnot read\n", capture_output=True, text=True,
                       timeout=120, env=ENV, encoding="utf-8")
    assert r.returncode == 0, r.stderr
    # the cycle model answers 'a' after the template's "\n", then cycles: 12 byte tokens
    assert r.stdout == "aé中😀 a\naé中😀 a\n"
    assert "conversation cleared" in r.stderr and "tokens" in r.stderr


@pytest.mark.parametrize("backend", ["auto", "hf"])
def test_generate_names_its_backend(model_dir, backend):
    """auto picks the fast backend on CPU for a Llama target; --backend hf keeps the model's own forward."""
    cmd = [sys.executable, "-m", "eaglespec.cli.main", "generate", "--target", str(model_dir), "--device", "cpu",
           "--prompt", "hi", "--max-new-tokens", "6", "--backend", backend, "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=ENV, encoding="utf-8")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["stats"]["backend"] == ("fast" if backend == "auto" else "hf")


def test_chat_keeps_the_conversation():
    torch.manual_seed(0)
    tok = byte_tokenizer()
    model = tiny_target(vocab=BYTE_VOCAB, seed=2)
    es = EagleSpec(model, tok, tiny_drafter(model))
    prompts = []
    real_stream = es.stream

    def spy(prompt, *args, **kwargs):
        prompts.append(list(prompt))
        return real_stream(prompt, *args, **kwargs)

    es.stream = spy
    out = io.StringIO()
    n = chat_loop(es, io.StringIO("first\nsecond\n"), out, io.StringIO(), system="be nice", max_new_tokens=6)
    assert n == 2
    replies = out.getvalue().split("\n")[:2]
    history = [{"role": "system", "content": "be nice"}, {"role": "user", "content": "first"},
               {"role": "assistant", "content": replies[0]}, {"role": "user", "content": "second"}]
    assert prompts[1] == es.encode(history)  # turn 2 sees turn 1 through the chat template
    assert prompts[1][: len(prompts[0])] == prompts[0]


def test_report_command(model_dir, tmp_path, capsys):
    png, js = tmp_path / "r.png", tmp_path / "r.json"
    assert main(["report", "--target", str(model_dir), "--device", "cpu", "--prompt", "a", "--prompt", "中",
                 "--max-new-tokens", "10", "--raw", "--out", str(png), "--json", str(js)]) == 0
    table = capsys.readouterr().out
    assert "depth" in table and "time:" in table
    s = json.loads(js.read_text())
    assert s["requests"] == 2 and s["new_tokens"] == 20 and png.stat().st_size > 20_000
    png2 = tmp_path / "again.png"
    assert main(["report", "--from", str(js), "--out", str(png2)]) == 0 and png2.stat().st_size > 20_000
    assert main(["report", "--from", str(png)]) == 2  # not a summary: one-line error, exit 2
    assert "cannot read the summary" in capsys.readouterr().err
    js.write_text('{"tau": 1}')
    assert main(["report", "--from", str(js)]) == 2
    assert "not an eaglespec report summary" in capsys.readouterr().err


def test_serve_command(model_dir, monkeypatch):
    """`eaglespec serve` wiring, in-process: uvicorn.run is replaced by a recorder (the real server is
    exercised in test_server.py)."""
    import uvicorn
    from fastapi.testclient import TestClient

    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(app=app, **kw))
    monkeypatch.setenv("EAGLESPEC_API_KEY", "k")
    assert main(["serve", "--target", str(model_dir), "--device", "cpu", "--model-name", "cyc",
                 "--port", "8123"]) == 0
    assert (seen["host"], seen["port"]) == ("127.0.0.1", 8123)
    with TestClient(seen["app"]) as c:
        assert c.get("/health").json()["model"] == "cyc"
        assert c.post("/v1/completions", json={"prompt": "a"}).status_code == 401
        r = c.post("/v1/completions", json={"model": "cyc", "prompt": "a", "max_tokens": 5},
                   headers={"Authorization": "Bearer k"})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == "é中"
    assert main(["serve", "--target", str(model_dir), "--max-queue", "0"]) == 2
