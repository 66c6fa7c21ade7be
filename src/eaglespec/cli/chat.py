"""`eaglespec chat`: an interactive, streaming, multi-turn chat with the target's chat template.

Reads one user message per line from stdin (a terminal or a pipe), streams the reply to stdout
as rounds are accepted, and keeps the conversation. Commands: /reset (forget the conversation),
/exit or /quit (or end of input). Per-turn stats go to stderr, so stdout holds only the replies.
"""

from __future__ import annotations

import argparse
import sys

from eaglespec.cli.args import (
    add_model_args,
    add_sampling_args,
    add_tree_args,
    check_model_inputs,
    load_eaglespec,
    non_negative,
    sampling_options,
)
from eaglespec.errors import EagleSpecError

HELP = "type a message and press Enter; /reset forgets the conversation, /exit quits (or Ctrl-D)"


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("chat", help="interactive multi-turn chat, streamed (reads stdin, one message a line)",
                              description="Interactive chat with the target's chat template. " + HELP + ".")
    add_model_args(p)
    add_tree_args(p)
    add_sampling_args(p)
    p.add_argument("--system", default=None, help="a system message that starts the conversation")
    p.add_argument("--max-new-tokens", type=int, default=256, help="longest reply in tokens (default 256)")
    p.add_argument("--quiet", action="store_true", help="no banner, prompts or per-turn stats on stderr")
    p.set_defaults(func=cmd_chat)


def fit_history(es, messages: list[dict], max_new_tokens: int) -> list[int]:
    """Token ids of the conversation; drops the oldest turns (never the system message or the last
    user message) until prompt + reply fit the context."""
    while True:
        ids = es.encode(messages)
        if len(ids) + max_new_tokens <= es.context_length:
            return ids
        first = 1 if messages[0]["role"] == "system" else 0
        if len(messages) - first <= 1:
            raise EagleSpecError(f"the message is too long: {len(ids)} tokens + a {max_new_tokens}-token reply "
                                 f"exceed the context ({es.context_length} tokens)")
        del messages[first: first + 2 if len(messages) - first > 2 else first + 1]


def chat_loop(es, stdin, stdout, stderr, system: str | None = None, max_new_tokens: int = 256,
              quiet: bool = False, **sampling) -> int:
    """Run the conversation until /exit or end of input; returns the number of replies."""
    interactive = hasattr(stdin, "isatty") and stdin.isatty()
    messages: list[dict] = [{"role": "system", "content": system}] if system else []
    replies = 0

    def note(msg: str) -> None:
        if not quiet:
            print(msg, file=stderr, flush=True)

    note(f"eaglespec chat: {HELP}")
    while True:
        if interactive and not quiet:
            print("you> ", end="", file=stderr, flush=True)
        line = stdin.readline()
        if not line:
            break
        text = line.rstrip("\n")
        if not text.strip():
            continue
        if text.strip() in ("/exit", "/quit"):
            break
        if text.strip() == "/reset":
            messages = messages[:1] if system else []
            note("(conversation cleared)")
            continue
        messages.append({"role": "user", "content": text})
        try:
            ids = fit_history(es, messages, max_new_tokens)
        except EagleSpecError as exc:
            messages.pop()
            note(f"eaglespec: {exc}")
            continue
        st = es.stream(ids, max_new_tokens, **sampling)
        for piece in st:
            stdout.write(piece)
            stdout.flush()
        stdout.write("\n")
        stdout.flush()
        messages.append({"role": "assistant", "content": st.text})
        replies += 1
        s = st.output().stats
        note(f"[{s['new_tokens']} tokens, {s['tokens_per_second']} tok/s, tau {s['tau']:.2f}, "
             f"{st.finish_reason}]")
    return replies


def cmd_chat(args: argparse.Namespace) -> int:

    non_negative(args, "max_new_tokens")
    config = check_model_inputs(args)
    es = load_eaglespec(args, config)
    chat_loop(es, sys.stdin, sys.stdout, sys.stderr, args.system, args.max_new_tokens, args.quiet,
              **sampling_options(args, getattr(es.model, "generation_config", None)))
    return 0
