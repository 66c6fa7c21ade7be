"""`eaglespec train` / `regenerate` argument handling: bad input -> one line on stderr, exit 2."""

from __future__ import annotations

from eaglespec.cli.main import build_parser, main


def test_train_flags_parse():
    args = build_parser().parse_args(["train", "--target", "T", "--data", "d.json", "--method", "hass", "--out", "o",
                                      "--steps", "5", "--epochs", "2", "--max-length", "64", "--batch-size", "3",
                                      "--lr", "1e-3", "--ttt-steps", "4", "--draft-vocab", "100", "--device", "cpu",
                                      "--resume"])
    assert (args.method, args.steps, args.ttt_steps, args.draft_vocab, args.resume) == ("hass", 5, 4, 100, True)
    r = build_parser().parse_args(["regenerate", "--target", "T", "--data", "a", "--out", "b", "--seed", "3"])
    assert r.func.__name__ == "cmd_regenerate" and r.seed == 3 and r.decoder == "auto"


def test_regenerate_bad_flags_are_one_line_before_loading(tmp_path, capsys):
    assert main(["regenerate", "--target", str(tmp_path / "nothing"), "--data", "a", "--out", "b",
                 "--decoder", "vllm"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["eaglespec: error: --decoder 'vllm': expected one of hf, static, auto"]
    assert main(["regenerate", "--data", "a", "--out", "b", "--time-budget", "0"]) == 2
    assert capsys.readouterr().err.strip() == "eaglespec: error: --time-budget must be > 0, got 0.0"


def test_train_bad_config_and_values(tmp_path, capsys):
    cfg = tmp_path / "c.json"
    cfg.write_text('{"data": "x.json", "out": "o", "bogus": 1}')
    assert main(["train", "--config", str(cfg)]) == 2
    assert "unknown option 'bogus'" in capsys.readouterr().err
    cfg.write_text("{not json")
    assert main(["train", "--config", str(cfg)]) == 2
    assert "malformed JSON" in capsys.readouterr().err
    assert main(["train", "--data", "x", "--out", "o", "--steps", "0"]) == 2
    assert "--steps must be > 0" in capsys.readouterr().err
    assert main(["train", "--data", "x", "--out", "o", "--stop-after", "0"]) == 2
    assert "--stop-after must be > 0" in capsys.readouterr().err
    assert main(["train", "--data", "x", "--out", "o", "--stop-after-seconds", "-5"]) == 2
    assert "--stop-after-seconds must be > 0" in capsys.readouterr().err
    assert main(["train", "--data", "x", "--out", "o", "--ttt-decay", "0"]) == 2
    assert "--ttt-decay must be > 0" in capsys.readouterr().err
    assert main(["train", "--out", "o"]) == 2
    assert "--data is required" in capsys.readouterr().err


def test_train_init_end_to_end_and_refusals(tmp_path, capsys):
    """--init DIR: a CLI run starts from a drafter the CLI trained; mismatches are one line, exit 2."""
    import json

    import torch

    from eaglespec.checkpoint.drafter import load_drafter

    from conftest import BYTE_VOCAB, byte_tokenizer, tiny_target

    target = tmp_path / "target"
    tiny_target(vocab=BYTE_VOCAB).save_pretrained(target)
    byte_tokenizer().save_pretrained(target)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"conversations": [{"from": "human", "value": f"question {i}"},
                                                          {"from": "gpt", "value": f"an answer number {i}"}]}) + "\n"
                            for i in range(6)))
    common = ["train", "--target", str(target), "--data", str(data), "--device", "cpu", "--steps", "2",
              "--batch-size", "2", "--max-length", "64", "--ttt-steps", "2", "--eval-fraction", "0"]
    assert main([*common, "--out", str(tmp_path / "a"), "--draft-vocab", "40", "--stop-after", "1"]) == 0
    assert load_drafter(tmp_path / "a", target_num_layers=4).manifest["trained_steps"] == 1  # paused, then resumed:
    assert main([*common, "--out", str(tmp_path / "a"), "--draft-vocab", "40", "--resume"]) == 0
    assert main([*common, "--out", str(tmp_path / "b"), "--init", str(tmp_path / "a"), "--lr", "0",
                 "--ttt-attention", "factored", "--ttt-decay", "1.0"]) == 0
    a = load_drafter(tmp_path / "a", target_num_layers=4)
    b = load_drafter(tmp_path / "b", target_num_layers=4)
    assert b.cfg.draft_vocab_size == 40 and all(torch.equal(a.state_dict()[k], v) for k, v in b.state_dict().items())
    assert b.manifest["hyperparameters"]["init_from"] == str(tmp_path / "a")
    assert (a.manifest["hyperparameters"]["ttt_attention"], b.manifest["hyperparameters"]["ttt_attention"]) == \
        ("dense", "factored")
    assert (a.manifest["hyperparameters"]["ttt_decay"], b.manifest["hyperparameters"]["ttt_decay"]) == (0.8, 1.0)
    capsys.readouterr()
    assert main([*common, "--out", str(tmp_path / "c"), "--init", str(tmp_path / "a"), "--draft-vocab", "30"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("eaglespec: error: ") and "config.json: draft_vocab_size 40 is above --draft-vocab 30" in err
    assert not (tmp_path / "c").exists()
    assert main([*common, "--out", str(tmp_path / "g"), "--init", str(tmp_path / "a"), "--draft-vocab", "50"]) == 0
    assert "draft vocabulary grown 40 -> 50" in capsys.readouterr().err
    assert load_drafter(tmp_path / "g", target_num_layers=4).cfg.draft_vocab_size == 50
    assert main([*common, "--out", str(tmp_path / "b"), "--init", str(tmp_path / "a"), "--resume"]) == 2
    assert "--init and --resume together" in capsys.readouterr().err
    wide = a.cfg.intermediate_size * 2
    assert main([*common, "--out", str(tmp_path / "w"), "--init", str(tmp_path / "a"), "--lr", "0",
                 "--intermediate-size", str(wide)]) == 0  # widened, then 2 steps at lr 0: the widened weights
    w = load_drafter(tmp_path / "w", target_num_layers=4)
    assert w.cfg.intermediate_size == wide and w.manifest["hyperparameters"]["intermediate_size"] == wide
    n = a.cfg.intermediate_size
    assert torch.equal(w.state_dict()["midlayer.mlp.down_proj.weight"][:, :n], a.state_dict()["midlayer.mlp.down_proj.weight"])
    assert not w.state_dict()["midlayer.mlp.down_proj.weight"][:, n:].any()
    capsys.readouterr()
    assert main([*common, "--out", str(tmp_path / "n"), "--init", str(tmp_path / "w"),
                 "--intermediate-size", str(n)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"config.json: intermediate_size {wide} is above --intermediate-size {n}" in err
    assert not (tmp_path / "n").exists()
    assert main([*common, "--out", str(tmp_path / "f"), "--intermediate-size", "24", "--stop-after", "1"]) == 0
    assert main([*common, "--out", str(tmp_path / "f"), "--resume"]) == 0  # the saved width, not the target's
    assert load_drafter(tmp_path / "f", target_num_layers=4).cfg.intermediate_size == 24


def test_train_and_regenerate_decontaminate_and_shard_the_state(tmp_path, capsys):
    """--exclude (on by default): a conversation sharing a 13-word run with an evaluation prompt is dropped before
    training and before regeneration, with one line of counts on stderr; --exclude '' keeps it. --state-shard-size
    bounds every file of the training state."""
    import json

    from conftest import BYTE_VOCAB, byte_tokenizer, tiny_target

    target = tmp_path / "target"
    tiny_target(vocab=BYTE_VOCAB).save_pretrained(target)
    byte_tokenizer().save_pretrained(target)
    bench = tmp_path / "bench.txt"
    prompt = "Please write one short poem about the quiet sea at night under a bright full moon"  # 16 words
    bench.write_text(prompt + "\n")
    data = tmp_path / "data.jsonl"
    questions = [f"question {i}" for i in range(5)] + [f"hi. {prompt.upper()}!"]
    data.write_text("".join(json.dumps({"conversations": [{"from": "human", "value": q},
                                                          {"from": "gpt", "value": f"answer {i}"}]}) + "\n"
                            for i, q in enumerate(questions)))
    common = ["train", "--target", str(target), "--data", str(data), "--device", "cpu", "--steps", "1",
              "--batch-size", "2", "--max-length", "256", "--ttt-steps", "2", "--eval-fraction", "0"]
    capsys.readouterr()
    assert main([*common, "--out", str(tmp_path / "a"), "--exclude", f"mtbench,{bench}",
                 "--state-shard-size", "2KB"]) == 0
    err = capsys.readouterr().err
    assert (f"eaglespec train: decontamination: dropped 1 of 6 conversations sharing a 13-word run with an "
            f"evaluation prompt (mtbench 0, {bench} 1)") in err
    assert "eaglespec train: 5 conversations" in err
    shards = list((tmp_path / "a").glob("training_state-*.safetensors"))
    assert len(shards) > 1 and all(p.stat().st_size <= 2000 for p in shards)
    assert main([*common, "--out", str(tmp_path / "b"), "--exclude", ""]) == 0
    err = capsys.readouterr().err
    assert "decontamination:" not in err and "eaglespec train: 6 conversations" in err
    assert main([*common, "--out", str(tmp_path / "c"), "--state-shard-size", "100"]) == 2
    assert "--state-shard-size must be a size of at least 1024 bytes" in capsys.readouterr().err
    assert main([*common, "--out", str(tmp_path / "c"), "--exclude", "nosuchfile"]) == 2
    assert "--exclude nosuchfile" in capsys.readouterr().err
    out = tmp_path / "regen.jsonl"
    assert main(["regenerate", "--target", str(target), "--data", str(data), "--out", str(out), "--device", "cpu",
                 "--max-new-tokens", "2", "--decoder", "hf", "--exclude", str(bench)]) == 0
    assert "eaglespec regenerate: decontamination: dropped 1 of 6 conversations" in capsys.readouterr().err
    assert len(out.read_text().splitlines()) == 5
