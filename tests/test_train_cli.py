"""`eaglespec train` / `regenerate` argument handling: bad input -> one line on stderr, exit 2."""

from __future__ import annotations

from eaglespec.cli import build_parser, main


def test_train_flags_parse():
    args = build_parser().parse_args(["train", "--target", "T", "--data", "d.json", "--method", "hass", "--out", "o",
                                      "--steps", "5", "--epochs", "2", "--max-length", "64", "--batch-size", "3",
                                      "--lr", "1e-3", "--ttt-steps", "4", "--draft-vocab", "100", "--device", "cpu",
                                      "--resume"])
    assert (args.method, args.steps, args.ttt_steps, args.draft_vocab, args.resume) == ("hass", 5, 4, 100, True)
    r = build_parser().parse_args(["regenerate", "--target", "T", "--data", "a", "--out", "b"])
    assert r.func.__name__ == "cmd_regenerate"


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
    assert main(["train", "--out", "o"]) == 2
    assert "--data is required" in capsys.readouterr().err
