"""`eaglespec train`, `regenerate` and `synth-prompts` (DESIGN.md, the command-line contract)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from eaglespec.cli.args import check_target, log
from eaglespec.errors import EagleSpecError

TRAIN_FLAGS = ("target", "data", "method", "out", "steps", "epochs", "max_length", "batch_size", "lr", "ttt_steps",
               "draft_vocab", "device", "dtype", "grad_accum", "limit", "seed", "save_every", "eval_every",
               "eval_fraction", "warmup_steps", "hass_steps", "noise", "weight_decay", "log_every", "feature_cache", "time_budget",
               "init", "ttt_attention", "ttt_decay", "intermediate_size", "exclude", "state_shard_size")
EXCLUDE_HELP = ("drop conversations sharing a 13-word run with these evaluation prompt sets (bench's --dataset names "
                "or files, comma-separated; default mtbench,humaneval where installed, MT-bench with both turns; "
                "'' for none); one line on stderr reports the counts")
DECODER_HELP = ("HF generate (hf), a static-cache batched decoder for Llama-family targets (static), or static "
                "where the target allows it (auto)")


def add_parser(subparsers) -> None:
    """Register `train`, `regenerate` and `synth-prompts`."""
    t = subparsers.add_parser("train", help="train an EAGLE-3 / HASS / EAGLE-1 drafter for a frozen target")
    t.add_argument("--config", default=None, help="JSON file of options (flag names with _ ; flags override it)")
    t.add_argument("--target", default=None, help="target model (default: SmolLM2-135M-Instruct)")
    t.add_argument("--data", default=None, help="conversations: ShareGPT or OpenAI form, JSON or JSONL")
    t.add_argument("--method", default=None, choices=["eagle1", "hass", "eagle3"], help="objective (default eagle3)")
    t.add_argument("--out", default=None, help="output directory: a loadable drafter + training state")
    t.add_argument("--steps", type=int, default=None, help="optimizer steps (default: from --epochs)")
    t.add_argument("--epochs", type=float, default=None, help="passes over the data when --steps is not given (1)")
    t.add_argument("--max-length", type=int, default=None, help="truncate samples to this many tokens (2048)")
    t.add_argument("--batch-size", type=int, default=None, help="conversations packed per micro-batch (4)")
    t.add_argument("--grad-accum", type=int, default=None, help="micro-batches per optimizer step (1)")
    t.add_argument("--lr", type=float, default=None, help="peak learning rate (1e-4)")
    t.add_argument("--ttt-steps", type=int, default=None, help="EAGLE-3 training-time test steps (7)")
    t.add_argument("--ttt-decay", type=float, default=None,
                   help="EAGLE-3 TTT step s weighs decay**s in the loss (0.8, the paper's); 1.0 weighs every step alike")
    t.add_argument("--ttt-attention", default=None, choices=["dense", "factored"],
                   help="how a TTT / HASS step attends: a dense mask over every step's keys (default), or factored: "
                        "the prefix block plus each row's own keys of the earlier steps (the same result, less work)")
    t.add_argument("--hass-steps", type=int, default=None, help="HASS alignment steps (3)")
    t.add_argument("--draft-vocab", type=int, default=None,
                   help="EAGLE-3 draft vocabulary size (32000, capped); with --init, a size above the checkpoint's "
                        "grows its vocabulary (the most frequent answer tokens join)")
    t.add_argument("--noise", default=None, choices=["uniform", "length-scaled", "none"],
                   help="EAGLE-1/HASS feature noise: uniform U(-0.1,0.1) (paper) or length-scaled (reference code)")
    t.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda when available)")
    t.add_argument("--dtype", default=None, help="target dtype (default: bf16 on GPU, fp32 on CPU)")
    t.add_argument("--limit", type=int, default=None, help="use only the first N conversations")
    t.add_argument("--seed", type=int, default=None, help="random seed of the initialisation and data order (0)")
    t.add_argument("--weight-decay", type=float, default=None, help="AdamW weight decay (0.0)")
    t.add_argument("--warmup-steps", type=int, default=None,
                   help="linear learning-rate warmup steps before the cosine decay (default: 5%% of the steps)")
    t.add_argument("--save-every", type=int, default=None, help="checkpoint every N steps (0: at the end)")
    t.add_argument("--eval-every", type=int, default=None, help="evaluate every N steps (0: at the end)")
    t.add_argument("--eval-fraction", type=float, default=None, help="held-out fraction of the data, split by prompt (0.02)")
    t.add_argument("--log-every", type=int, default=None, help="print a training line every N steps (10)")
    t.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="fit the schedule (warmup + cosine) into this many seconds of training steps, timed over "
                        "the first steps (never more steps than --steps / --epochs give)")
    t.add_argument("--resume", action="store_true", help="continue the run saved in --out")
    t.add_argument("--stop-after", type=int, default=None, metavar="STEPS",
                   help="train this many steps of the run now, write the checkpoint and stop; --resume continues "
                        "(on any number of GPUs with the same global batch: batch-size x grad-accum x GPUs)")
    t.add_argument("--stop-after-seconds", type=float, default=None, metavar="SECONDS",
                   help="the same after about this many seconds of steps (for jobs with a time limit: a run longer "
                        "than one job, e.g. --time-budget 1800 over several jobs, each continued with --resume)")
    t.add_argument("--init", default=None, metavar="DIR",
                   help="start from this drafter checkpoint (its weights and draft vocabulary) with a fresh "
                        "optimizer and schedule; it must fit the target (refused otherwise)")
    t.add_argument("--intermediate-size", type=int, default=None, metavar="N",
                   help="the drafter's MLP width (default: the target's); with --init, the checkpoint's MLP is "
                        "widened to N keeping its function (new units start silent: zero down-projection columns)")
    t.add_argument("--exclude", default=None, metavar="LIST", help=EXCLUDE_HELP)
    t.add_argument("--state-shard-size", default=None, metavar="SIZE",
                   help="largest file of the saved training state, e.g. 15MB (default), 500KB or a byte count")
    t.add_argument("--feature-cache", default=None,
                   help="offline features: a directory of cached target features (written from --data on "
                        "first use, refused when its manifest names another target or other layer ids)")
    t.set_defaults(func=cmd_train)

    r = subparsers.add_parser("regenerate", help="rewrite the assistant turns of a data file with the target")
    r.add_argument("--target", default=None, help="target model (default: SmolLM2-135M-Instruct)")
    r.add_argument("--data", required=True, help="conversations: ShareGPT or OpenAI form, JSON or JSONL")
    r.add_argument("--out", required=True, help="output JSONL (appended; rerun to resume)")
    r.add_argument("--batch-size", type=int, default=32, help="conversations generated together (32)")
    r.add_argument("--max-new-tokens", type=int, default=512, help="longest regenerated turn in tokens (512)")
    r.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    r.add_argument("--max-turns", type=int, default=None, help="regenerate at most N assistant turns each")
    r.add_argument("--limit", type=int, default=None, help="only the first N conversations")
    r.add_argument("--seed", type=int, default=None,
                   help="seed of the sampling (with --temperature): another seed, other answers to the same prompts")
    r.add_argument("--shard", default=None, metavar="I/N",
                   help="only every N-th conversation (by first-message length) from the I-th: N processes, each "
                        "with its own --out, split one file")
    r.add_argument("--decoder", default="auto",
                   help=DECODER_HELP + "; default auto")
    r.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="start no batch that the slowest one so far would not finish within SECONDS (rerun resumes)")
    r.add_argument("--exclude", default=None, metavar="LIST", help=EXCLUDE_HELP)
    r.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda when available)")
    r.add_argument("--dtype", default=None, help="target dtype (default: bf16 on GPU, fp32 on CPU)")
    r.set_defaults(func=cmd_regenerate)

    s = subparsers.add_parser("synth-prompts", help="user queries written by the target itself (Magpie), for "
                                                    "regenerate to answer")
    s.add_argument("--target", default=None, help="target model (default: SmolLM2-135M-Instruct)")
    s.add_argument("--out", required=True, help="output JSONL (appended; rerun to resume)")
    s.add_argument("--count", type=int, required=True, help="queries the output should hold")
    s.add_argument("--batch-size", type=int, default=256, help="queries sampled together (256)")
    s.add_argument("--max-new-tokens", type=int, default=256, help="longest query; longer ones are dropped (256)")
    s.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (1.0)")
    s.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1.0: off)")
    s.add_argument("--seed", type=int, default=0, help="another seed, other queries (0)")
    s.add_argument("--exclude", default="mtbench,humaneval", metavar="LIST",
                   help="drop queries sharing a 13-word run with these prompt sets (bench's --dataset names or "
                        "files, comma-separated; default mtbench,humaneval where installed; '' for none)")
    s.add_argument("--decoder", default="hf",
                   help=DECODER_HELP + "; default hf")
    s.add_argument("--starts", default="", metavar="LIST",
                   help="words a query begins with, one drawn per query, comma-separated (e.g. Write,Explain,Imagine; "
                        "default: none, the model starts the query itself)")
    s.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda when available)")
    s.add_argument("--dtype", default=None, help="target dtype (default: bf16 on GPU, fp32 on CPU)")
    s.set_defaults(func=cmd_synth_prompts)


def _options(args: argparse.Namespace) -> dict:
    opts: dict = {}
    if args.config:
        try:
            opts = json.loads(Path(args.config).read_text())
        except OSError as exc:
            raise EagleSpecError(f"{args.config}: cannot read the config ({exc.strerror})") from None
        except json.JSONDecodeError as exc:
            raise EagleSpecError(f"{args.config}: malformed JSON ({exc.msg} at line {exc.lineno})") from None
        if not isinstance(opts, dict):
            raise EagleSpecError(f"{args.config}: expected a JSON object")
        unknown = sorted(set(opts) - set(TRAIN_FLAGS) - {"resume"})
        if unknown:
            raise EagleSpecError(f"{args.config}: unknown option {unknown[0]!r}")
    for k in TRAIN_FLAGS:
        v = getattr(args, k, None)
        if v is not None:
            opts[k] = v
    opts["resume"] = bool(args.resume or opts.get("resume", False))
    return opts


def state_shard_bytes(text: str) -> int:
    """--state-shard-size: '15MB', '500KB', '2MiB' or a byte count -> bytes (at least MIN_SHARD_BYTES)."""
    from eaglespec.checkpoint.io import parse_size
    from eaglespec.train.state import MIN_SHARD_BYTES

    try:
        size = parse_size(text)
    except EagleSpecError:
        size = 0
    if size < MIN_SHARD_BYTES:
        raise EagleSpecError(f"--state-shard-size must be a size of at least {MIN_SHARD_BYTES} bytes such as 15MB, "
                             f"got {text!r}")
    return size


def exclusion_sets(spec: str | None, command: str, verbose: bool = True) -> dict[str, list[str]]:
    """--exclude's prompt sets (train.decontam.evaluation_sets); a default set not installed is noted on stderr."""
    from eaglespec.train.decontam import evaluation_sets

    sets, missing = evaluation_sets(spec)
    for note in missing if verbose else ():
        log(f"eaglespec {command}: {note}")
    return sets


def decontaminated(convs: list[dict], sets: dict[str, list[str]], command: str, verbose: bool = True) -> list[dict]:
    """`convs` without those sharing a 13-word run with a prompt of `sets`; one line on stderr with the counts."""
    from eaglespec.train.decontam import decontaminate

    if not sets:
        return convs
    kept, report = decontaminate(convs, sets)
    if verbose:
        log(f"eaglespec {command}: {report.line()}")
    return kept


def check_data(path: str) -> None:
    """--data must name an existing file or directory (read once the target has loaded)."""
    if not Path(path).exists():
        raise EagleSpecError(f"--data {path}: no such file")


def cmd_train(args: argparse.Namespace) -> int:
    from eaglespec.backends.loading import load_target, resolve_device, resolve_target
    from eaglespec.train.data import read_conversations, tokenize_all
    from eaglespec.train.trainer import (
        TrainConfig,
        check_start,
        finish_distributed,
        init_distributed,
        init_drafter,
        train,
        world_rank,
    )

    o = _options(args)
    for req in ("data", "out"):
        if not o.get(req):
            raise EagleSpecError(f"train: --{req} is required")
    check_start(o.get("init"), o["resume"])  # before loading the target
    for k in ("stop_after", "stop_after_seconds"):
        if getattr(args, k) is not None and getattr(args, k) <= 0:
            raise EagleSpecError(f"--{k.replace('_', '-')} must be > 0, got {getattr(args, k)}")
    for k in ("steps", "batch_size", "max_length", "ttt_steps", "draft_vocab", "grad_accum", "hass_steps",
              "time_budget", "ttt_decay", "intermediate_size"):
        if o.get(k) is not None and o[k] <= 0:
            raise EagleSpecError(f"--{k.replace('_', '-')} must be > 0, got {o[k]}")
    check_data(o["data"])
    check_target(o.get("target"))
    fields = {k: o[k] for k in ("steps", "epochs", "batch_size", "grad_accum", "max_length", "lr", "ttt_steps",
                                "hass_steps", "draft_vocab", "seed", "save_every", "eval_every", "eval_fraction",
                                "warmup_steps", "noise", "weight_decay", "log_every", "ttt_attention", "ttt_decay",
                                "intermediate_size")
              if o.get(k) is not None}
    if o.get("time_budget") is not None:
        fields["time_budget_s"] = float(o["time_budget"])
    if o.get("state_shard_size") is not None:
        fields["state_shard_bytes"] = state_shard_bytes(o["state_shard_size"])
    # before init_distributed: converting the default target saves a checkpoint, which transformers skips on
    # ranks other than 0 once a process group exists
    target = resolve_target(o.get("target"))
    device = init_distributed(resolve_device(o.get("device")))
    _, rank = world_rank()
    exclude = exclusion_sets(o.get("exclude"), "train", rank == 0)  # a bad file fails before the target loads
    cfg = TrainConfig(method=o.get("method") or "eagle3", device=device, init_from=o.get("init"), **fields)
    model, tok = load_target(target, device=device, dtype=o.get("dtype"))
    drafter = init_drafter(cfg.init_from, model, cfg, tok) if cfg.init_from else None  # refused before the data
    convs = decontaminated(read_conversations(o["data"], o.get("limit")), exclude, "train", rank == 0)
    max_length = o.get("max_length") or 2048
    samples = tokenize_all(tok, convs, max_length, progress=rank == 0 and args.verbose)
    if rank == 0:
        n_tok = sum(s.ids.numel() for s in samples)
        n_loss = sum(int(s.loss_mask.sum()) for s in samples)
        log(f"eaglespec train: {len(samples)} conversations, {n_tok} tokens ({n_loss} assistant) from {o['data']}")
    if o.get("feature_cache"):
        from eaglespec.train.features import attach_feature_cache
        from eaglespec.train.trainer import drafter_config

        ids = drafter.feature_layer_ids if drafter is not None else drafter_config(model, cfg.method, 1).aux_layer_ids
        samples = attach_feature_cache(o["feature_cache"], model, tok, samples, ids, rank=rank)
    res = train(model, samples, cfg, o["out"], tokenizer=tok, resume=o["resume"], drafter=drafter,
                pause_after=args.stop_after, pause_after_s=args.stop_after_seconds)
    finish_distributed()
    if rank == 0 and res.history:
        last = res.history[-1]
        log(f"eaglespec train: at step {res.steps}: last train top-1 by step "
             f"{[round(a, 3) for a in last['acc_by_step']]}")
    return 0


def cmd_regenerate(args: argparse.Namespace) -> int:
    from eaglespec.backends.batched import check_decoder
    from eaglespec.backends.loading import load_target
    from eaglespec.train.regenerate import parse_shard, regenerate

    for k in ("batch_size", "max_new_tokens", "time_budget"):
        if getattr(args, k) is not None and getattr(args, k) <= 0:
            raise EagleSpecError(f"--{k.replace('_', '-')} must be > 0, got {getattr(args, k)}")
    shard = parse_shard(args.shard) if args.shard is not None else None
    check_decoder(args.decoder)
    check_data(args.data)
    check_target(args.target)
    exclude = exclusion_sets(args.exclude, "regenerate")  # a bad file fails before the target loads
    model, tok = load_target(args.target, device=args.device, dtype=args.dtype)
    n = regenerate(model, tok, args.data, args.out, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
                   temperature=args.temperature, max_turns=args.max_turns, limit=args.limit, seed=args.seed,
                   shard=shard, decoder=args.decoder, time_budget=args.time_budget,
                   keep=lambda convs: decontaminated(convs, exclude, "regenerate"))
    log(f"eaglespec regenerate: wrote {n} conversations to {args.out}")
    return 0


def _exclusions(spec: str) -> list[str]:
    """The prompts of each named set; the default benchmarks are skipped where their packages are not installed."""
    return [t for texts in exclusion_sets(spec, "synth-prompts").values() for t in texts]


def cmd_synth_prompts(args: argparse.Namespace) -> int:
    from eaglespec.backends.batched import check_decoder
    from eaglespec.backends.loading import load_target
    from eaglespec.train.synth import MAX_CHARS, MIN_CHARS, NGRAM, synthesize

    for k in ("count", "batch_size", "max_new_tokens"):
        if getattr(args, k) <= 0:
            raise EagleSpecError(f"--{k.replace('_', '-')} must be > 0, got {getattr(args, k)}")
    if args.temperature <= 0 or not 0 < args.top_p <= 1:
        raise EagleSpecError(f"--temperature must be > 0 and --top-p in (0, 1], got {args.temperature}, {args.top_p}")
    check_decoder(args.decoder)
    check_target(args.target)
    exclude = _exclusions(args.exclude)
    model, tok = load_target(args.target, device=args.device, dtype=args.dtype)
    st = synthesize(model, tok, args.out, args.count, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
                    temperature=args.temperature, top_p=args.top_p, seed=args.seed, exclude=exclude,
                    decoder=args.decoder, starts=[w.strip() for w in args.starts.split(",") if w.strip()])
    log(f"eaglespec synth-prompts: {args.out} holds {st['total']} queries ({st['kept']} new; dropped "
         f"{st['unfinished']} unfinished, {st['length']} out of {MIN_CHARS}-{MAX_CHARS} characters, {st['duplicate']} duplicates, "
         f"{st['excluded']} sharing a {NGRAM}-word run with --exclude)")
    return 0
