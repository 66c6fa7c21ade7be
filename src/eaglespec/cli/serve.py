"""`eaglespec serve`: the OpenAI-compatible HTTP server (eaglespec.server) under uvicorn."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from eaglespec.cli.args import (
    add_batch_args,
    add_model_args,
    add_tree_args,
    check_model_inputs,
    check_module,
    load_eaglespec,
    log,
)
from eaglespec.errors import EagleSpecError

SERVER_MODULES = ("fastapi", "uvicorn", "prometheus_client")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "serve", help="run an OpenAI-compatible HTTP server (chat/completions, streaming, /metrics)",
        description="OpenAI-compatible server: POST /v1/chat/completions and /v1/completions (SSE streaming), "
                    "GET /v1/models, /health, /metrics. Up to --max-batch requests are generated together (continuous "
                    "batching: requests join between rounds and leave when done); the rest wait in a queue.")
    add_model_args(p)
    add_tree_args(p)
    add_batch_args(p, "8 on a CPU; 1 on a GPU, where the one-sequence fast path runs")
    p.add_argument("--host", default="127.0.0.1",
                   help="interface to bind (default 127.0.0.1: this machine only; 0.0.0.0 = every interface)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on /v1/* (default: the EAGLESPEC_API_KEY environment "
                        "variable, else no auth)")
    p.add_argument("--model-name", default=None,
                   help="the model id clients send and /v1/models lists (default: the target's name)")
    p.add_argument("--max-tokens-limit", type=int, default=None,
                   help="largest max_tokens a request may ask for (default: the model's context length)")
    p.add_argument("--default-max-tokens", type=int, default=256,
                   help="max_tokens when a request omits it (default 256, cut to the context left)")
    p.add_argument("--max-queue", type=int, default=256,
                   help="requests that may wait for the engine; more get 429 (default 256)")
    p.add_argument("--log-level", default=None, choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's log level (default: warning; info with -v, which logs every request)")
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    for module in SERVER_MODULES:
        check_module(module, "server", "serve")
    for name in ("max_queue", "default_max_tokens", "max_tokens_limit"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise EagleSpecError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if not 0 <= args.port < 65536:
        raise EagleSpecError(f"--port must be in 0..65535, got {args.port}")
    config = check_model_inputs(args)

    import uvicorn

    from eaglespec.api import settle_heap
    from eaglespec.backends.loading import DEFAULT_TARGET
    from eaglespec.server import create_app

    es = load_eaglespec(args, config)
    name = args.model_name or (Path(args.target).name if args.target else DEFAULT_TARGET)
    key = args.api_key or os.environ.get("EAGLESPEC_API_KEY") or None
    app = create_app(es, name, key, args.max_tokens_limit, args.default_max_tokens, args.max_queue)
    settle_heap()  # the loaded models out of the collector's way for the server's lifetime
    log(f"eaglespec: serving {name!r} on http://{args.host}:{args.port}/v1{' (Bearer auth on)' if key else ''}")
    level = args.log_level or ("info" if args.verbose else "warning")
    uvicorn.run(app, host=args.host, port=args.port, log_level=level)
    return 0
