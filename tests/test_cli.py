"""CLI: chat (piped stdin, multi-turn), report, serve; every flag has --help text; bad input is refused before
anything loads; quiet output by default; CPU threads; the install hint of the server extra."""

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
    assert {"generate", "chat", "serve", "bench", "report", "train", "regenerate", "synth-prompts",
            "convert"} <= set(sub.choices)
    for name, p in sub.choices.items():
        for action in p._actions:
            assert action.help and action.help != argparse.SUPPRESS, f"{name} {action.option_strings}"
        assert p.format_help()  # a stray % in a help text breaks --help
    assert sub.choices["serve"].parse_args([]).host == "127.0.0.1"
    args = parser.parse_args(["-v", "generate", "--prompt", "x", "--no-overlap", "--kernels", "--threads", "2",
                              "--backend", "hf"])
    assert args.verbose and (args.overlap, args.kernels, args.threads, args.backend) == (False, True, 2, "hf")
    assert args.round_graphs is None and args.draft_graphs is None and args.chunked_prefill is None


def test_engine_flags_build_the_engine_config():
    from eaglespec.cli.args import engine_config
    from eaglespec.config import EngineConfig

    args = build_parser().parse_args(["generate", "--prompt", "x", "--device", "cpu", "--no-round-graphs",
                                      "--adaptive", "--threads", "3"])
    assert engine_config(args) == EngineConfig(device="cpu", round_graphs=False, adaptive=True, threads=3)
    assert engine_config(build_parser().parse_args(["generate", "--prompt", "x"])) == EngineConfig()


@pytest.fixture
def no_loading(monkeypatch):
    """Loading a model fails the test: what is refused must be refused before it."""
    from eaglespec import api

    def fail(*_a, **_k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(api.EagleSpec, "from_pretrained", classmethod(fail))
    monkeypatch.setattr(api, "load_target", fail)


@pytest.mark.parametrize("argv, message", [
    (["generate", "--prompt", "x", "--draft", "/nonexistent/drafter"], "--draft /nonexistent/drafter: no such dir"),
    (["generate", "--prompt", "x", "--draft", "{empty}"], "config.json: file not found"),
    (["generate", "--prompt-file", "/nonexistent/prompt.txt"], "--prompt-file /nonexistent/prompt.txt: cannot read"),
    (["generate", "--prompt", "x", "--max-new-tokens", "-1"], "--max-new-tokens must be >= 0"),
    (["generate", "--prompt", "x", "--k", "-2"], "--k must be >= 0"),
    (["generate", "--prompt", "x", "--threads", "0"], "threads must be >= 1"),
    (["generate", "--prompt", "x", "--max-batch", "0"], "max_batch must be >= 1"),
    (["serve", "--prefill-chunk", "0"], "prefill_chunk must be >= 1"),
    (["generate", "--prompt", "x", "--dtype", "int8"], "--dtype 'int8'"),
    (["generate", "--prompt", "x", "--target", "./no/such/model"], "--target ./no/such/model: no such directory"),
    (["chat", "--draft", "/nonexistent/drafter"], "no such directory"),
    (["serve", "--draft", "/nonexistent/drafter"], "no such directory"),
    (["report", "--prompt-file", "/nonexistent/p.jsonl"], "cannot read the file"),
    (["bench", "--dataset", "nobench"], "--dataset nobench: not mtbench or humaneval nor a readable file"),
    (["bench", "--limit", "-1"], "--limit must be >= 0"),
    (["bench", "--backend", "fast"], "--backend: bench's methods name their backends"),
    (["bench", "--extra-draft", "/nonexistent/e1"], "--extra-draft /nonexistent/e1: no such directory"),
])
def test_bad_input_is_refused_before_the_target_loads(argv, message, no_loading, tmp_path, capsys):
    argv = [str(tmp_path) if a == "{empty}" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("eaglespec: error: ") and message in err[0], err


@pytest.mark.parametrize("lines, message", [
    ('"ok"\nnot json\n', "line 2 is not JSON"),
    ('{"text": "x"}\n', 'line 1 is not a prompt string or an object with a "prompt" string'),
    ("\n\n", "no prompts"),
])
def test_bad_prompt_lines_are_refused_before_the_target_loads(lines, message, no_loading, tmp_path, capsys):
    f = tmp_path / "prompts.jsonl"
    f.write_text(lines)
    assert main(["generate", "--prompt-file", str(f)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_generate_over_a_prompt_file_is_batched(model_dir, tmp_path, capsys):
    """A .jsonl prompt file: one JSON line per prompt, in order, from the batched engine, each the text that
    prompt gives alone."""
    prompts = ["ab", "xyz", "q"]
    f = tmp_path / "prompts.jsonl"
    f.write_text('"ab"\n{"prompt": "xyz"}\n\n"q"\n')
    argv = ["generate", "--target", str(model_dir), "--device", "cpu", "--prompt-file", str(f), "--raw",
            "--max-new-tokens", "5", "--max-batch", "2", "--json", "--threads", "1"]
    assert main(argv) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    es = EagleSpec.from_pretrained(str(model_dir), device="cpu")
    assert [line["text"] for line in lines] == [es.generate(p, 5, raw=True).text for p in prompts]
    assert {line["stats"]["backend"] for line in lines} == {"fast-batch"}


def test_generate_is_quiet_unless_verbose(model_dir):
    """Without -v stderr holds the stats line only; -v adds the drafter in use."""
    cmd = [sys.executable, "-m", "eaglespec.cli.main", "generate", "--target", str(model_dir), "--device", "cpu",
           "--prompt", "hi", "--max-new-tokens", "4", "--threads", "1"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=ENV, encoding="utf-8")
    assert r.returncode == 0, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("[4 tokens in ") and "tok/s" in lines[0], r.stderr
    v = subprocess.run([*cmd[:3], "-v", *cmd[3:]], capture_output=True, text=True, timeout=120, env=ENV,
                       encoding="utf-8")
    assert v.returncode == 0 and "eaglespec: no trained drafter given" in v.stderr, v.stderr


def test_install_hint_follows_how_eaglespec_was_installed(monkeypatch):
    import importlib.metadata

    from eaglespec.cli import args as cli_args

    class Dist:
        def __init__(self, text):
            self.text = text

        def read_text(self, name):
            return self.text if name == "direct_url.json" else None

    def installed(text):
        monkeypatch.setattr(importlib.metadata, "distribution", lambda name: Dist(text))
        return cli_args.install_hint("server")

    editable = json.dumps({"url": "file:///home/me/eaglespec", "dir_info": {"editable": True}})
    assert installed(editable) == 'pip install -e ".[server]" (run in /home/me/eaglespec)'
    assert installed(json.dumps({"url": "file:///src/e%20s", "dir_info": {}})) == 'pip install ".[server]" (run in /src/e s)'
    assert installed(None) == 'pip install "eaglespec[server]"'  # from an index: no direct_url.json


def test_serve_without_the_server_extra_names_the_install_command(monkeypatch, no_loading, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "uvicorn" else real(name, *a))
    assert main(["serve"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("eaglespec: error: serve needs the server extra: pip install ") and "[server]" in err


def test_threads_follow_the_free_cores(monkeypatch):
    """choose_threads: the allowed cores less those other processes keep busy (> half busy = taken), at least 1;
    apply_threads sets torch's threads on a CPU device only."""
    from eaglespec import cpu

    samples = iter([{0: (100, 1000), 1: (100, 1000)}, {0: (100, 1010), 1: (110, 1010)}])  # core 0 busy, 1 idle
    monkeypatch.setattr(cpu, "_allowed_cpus", lambda: {0, 1})
    monkeypatch.setattr(cpu, "_cpu_times", lambda: next(samples))
    assert cpu.choose_threads(0.02) == 1
    samples = iter([{0: (0, 0), 1: (0, 0)}, {0: (10, 10), 1: (6, 10)}])  # 0.4 of a core busy: 2 free
    assert cpu.choose_threads(0.02) == 2
    samples = iter([{0: (0, 0), 1: (0, 0)}, {0: (0, 10), 1: (0, 10)}])  # every core busy: still 1
    assert cpu.choose_threads(0.02) == 1
    n = torch.get_num_threads()
    try:
        assert cpu.apply_threads(1, "cpu") == 1 and torch.get_num_threads() == 1
        assert cpu.apply_threads(None, "cuda:0") is None and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(n)
    monkeypatch.undo()  # the real /proc/stat
    assert 1 <= cpu.choose_threads() <= len(os.sched_getaffinity(0))


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

    from eaglespec import api

    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(app=app, **kw))
    monkeypatch.setattr(api, "settle_heap", lambda: None)  # a frozen heap would outlive the test
    monkeypatch.setenv("EAGLESPEC_API_KEY", "k")
    assert main(["serve", "--target", str(model_dir), "--device", "cpu", "--model-name", "cyc",
                 "--port", "8123"]) == 0
    assert (seen["host"], seen["port"], seen["log_level"]) == ("127.0.0.1", 8123, "warning")
    with TestClient(seen["app"]) as c:
        assert c.get("/health").json()["model"] == "cyc"
        assert c.post("/v1/completions", json={"prompt": "a"}).status_code == 401
        r = c.post("/v1/completions", json={"model": "cyc", "prompt": "a", "max_tokens": 5},
                   headers={"Authorization": "Bearer k"})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == "é中"
    assert main(["serve", "--target", str(model_dir), "--max-queue", "0"]) == 2
