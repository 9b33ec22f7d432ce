"""`kvstrata bench perplexity FILE --url URL`: the perplexity of a text on any OpenAI-compatible server.

The server tokenizes FILE (`POST /tokenize`), the ids are cut into windows of `--ctx` tokens and each
window is scored through `/v1/completions` with `echo` and `logprobs` (server.py), the second half of
every window counting, as llama.cpp's `llama-perplexity` counts (windows.py states the rule). With
`--llama-perplexity BIN --model-file GGUF` the tool runs too, on the same file, context and window
count (llama.py), and the two estimates are printed with their ratio. The JSON goes to `--out-dir`,
with the machine, its paths made portable (bench/paths.py).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from kvstrata.bench.perplexity.llama import (LlamaPerplexityError, check_inputs, llama_command,
                                             run_llama_perplexity)
from kvstrata.bench.perplexity.server import PerplexityClient, ServerError
from kvstrata.bench.perplexity.windows import MIN_CTX, Perplexity, cut_windows, window_nlls

NAME = "kvstrata bench perplexity"


def add_perplexity_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="a UTF-8 text, e.g. bench/texts/alice-chapters-1-7.txt")
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the server's base URL (default: %(default)s)")
    parser.add_argument("--model", default=None, help="model id sent in requests (default: the first /v1/models lists)")
    parser.add_argument("--ctx", type=int, default=2048, help=f"tokens a window, >= {MIN_CTX} (default: %(default)s)")
    parser.add_argument("--max-windows", type=int, default=None, help="score only the first N windows (default: all)")
    parser.add_argument("--api-key", default=None, help="sent as a Bearer token")
    parser.add_argument("--label", default=None,
                        help="what the server is (e.g. 'kvstrata --dtype float32'): kept in the JSON and its name")
    parser.add_argument("--out-dir", type=Path, default=Path("bench/results"),
                        help="where the JSON goes (default: %(default)s)")
    peer = parser.add_argument_group("llama.cpp beside it")
    peer.add_argument("--llama-perplexity", metavar="BIN", default=None,
                      help="also run this llama-perplexity (.peers/llama.cpp/bin/llama-perplexity) on the same text")
    peer.add_argument("--model-file", metavar="GGUF", default=None, help="the GGUF llama-perplexity loads")
    peer.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                      help="llama-perplexity's -t (default: %(default)s, this machine's CPUs)")


def check_args(args: argparse.Namespace) -> str:
    """The text of FILE; ValueError or LlamaPerplexityError naming a bad flag, before any request."""
    if args.ctx < MIN_CTX:
        raise ValueError(f"--ctx must be >= {MIN_CTX} (got {args.ctx})")
    if args.max_windows is not None and args.max_windows < 1:
        raise ValueError(f"--max-windows must be >= 1 (got {args.max_windows})")
    if args.threads < 1:
        raise ValueError(f"--threads must be >= 1 (got {args.threads})")
    if args.llama_perplexity:
        check_inputs(args.llama_perplexity, args.model_file)
    path = Path(args.file)
    if not path.is_file():
        raise ValueError(f"{args.file} is not a file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {args.file} as UTF-8 text: {exc}") from None
    if not text.strip():
        raise ValueError(f"{args.file} holds no text")
    return text


def score_on_server(args: argparse.Namespace, text: str) -> dict[str, Any]:
    """Tokenize and score every window on the server; the figures of the run."""
    start = time.perf_counter()
    with PerplexityClient(args.url, args.api_key) as client:
        model = args.model or client.first_model()
        ids = client.tokenize(text)
        prefix = client.special_prefix()
        windows = cut_windows(ids, args.ctx, prefix, args.max_windows)
        if not windows:
            raise ValueError(f"{args.file} tokenizes to {len(ids)} tokens, fewer than one --ctx {args.ctx} window")
        ppl = Perplexity()
        for k, window in enumerate(windows):
            ppl.add(window_nlls(client.echo_logprobs(model, window), args.ctx))
            print(f"[{k + 1}/{len(windows)}] {ppl.value():.4f}", file=sys.stderr, flush=True)
    return {"model": model, "text_tokens": len(ids), "special_prefix": prefix, "windows": ppl.windows,
            "tokens_scored": ppl.tokens, "perplexity": ppl.value(), "error": ppl.error(),
            "per_window": ppl.per_window, "wall_s": time.perf_counter() - start}


def score_on_llama(args: argparse.Namespace, windows: int) -> dict[str, Any]:
    command = llama_command(args.llama_perplexity, args.model_file, args.file, args.ctx, windows, args.threads)
    estimate, seconds = run_llama_perplexity(command)
    return {"command": " ".join(command), "perplexity": estimate.perplexity, "error": estimate.error,
            "windows": estimate.chunks, "wall_s": seconds}


def command_line(args: argparse.Namespace) -> str:
    """The command that reproduces the run (without the API key)."""
    parts = [NAME, args.file, "--url", args.url, "--ctx", str(args.ctx)]
    for flag, value in (("--model", args.model), ("--max-windows", args.max_windows), ("--label", args.label),
                        ("--llama-perplexity", args.llama_perplexity), ("--model-file", args.model_file)):
        if value is not None:
            parts += [flag, str(value)]
    return " ".join(parts)


def run_perplexity(args: argparse.Namespace) -> int:
    try:
        text = check_args(args)
        ours = score_on_server(args, text)
        llama = score_on_llama(args, ours["windows"]) if args.llama_perplexity else None
    except (ValueError, ServerError, LlamaPerplexityError) as exc:
        print(f"{NAME}: {exc}", file=sys.stderr)
        return 2
    print(f"server  {args.url}  model={ours['model']}  PPL = {ours['perplexity']:.4f} +/- {ours['error'] or 0:.5f}  "
          f"tokens scored={ours['tokens_scored']}  windows={ours['windows']}  ctx={args.ctx}  "
          f"wall={ours['wall_s']:.1f} s")
    report: dict[str, Any] = {"command": command_line(args), "file": args.file, "url": args.url, "ctx": args.ctx,
                              "label": args.label, "server": ours}
    if llama is not None:
        ratio = ours["perplexity"] / llama["perplexity"]
        print(f"llama-perplexity  PPL = {llama['perplexity']:.4f} +/- {llama['error']:.5f}  "
              f"windows={llama['windows']}  wall={llama['wall_s']:.1f} s")
        print(f"server / llama-perplexity = {ratio:.4f}")
        report.update(llama_perplexity=llama, ratio=ratio)
    from kvstrata.bench.report import write_json  # its imports are heavier than this command's

    slug = re.sub(r"[^A-Za-z0-9.]+", "-", args.label)[:80].strip("-") + "-" if args.label else ""
    out = args.out_dir / f"perplexity-{slug}{time.strftime('%Y-%m-%d-%H%M%S')}.json"
    try:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        write_json(report, str(out))
    except OSError as exc:
        print(f"{NAME}: cannot write {out}: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out}", file=sys.stderr)
    return 0
