"""llama.cpp's `llama-perplexity` on the same text, context and window count, and its final estimate read back.

`bench/peers/build_llama_server.sh` builds the tool into `.peers/llama.cpp/bin/`. It prints each chunk's
running perplexity on stdout and its log on stderr, whose last useful line is
`Final estimate: PPL = <ppl> +/- <error>` (not always at the start of a line: the ETA it prints before
shares that line). Its scoring rule is the one windows.py follows.
"""
from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

FINAL = re.compile(r"Final estimate: PPL = ([0-9.]+(?:[eE][-+]?\d+)?) \+/- ([0-9.]+(?:[eE][-+]?\d+)?)")
CHUNKS = re.compile(r"calculating perplexity over (\d+) chunks, n_ctx=(\d+)")
TOO_SHORT = re.compile(r"you need at least (\d+) tokens to evaluate perplexity with a context of (\d+)")


class LlamaPerplexityError(Exception):
    """llama-perplexity could not run, or ended without a final estimate."""


@dataclass(frozen=True)
class LlamaEstimate:
    perplexity: float
    error: float  # its "+/-": the standard error of the mean NLL times the perplexity
    chunks: int | None  # windows it scored
    ctx: int | None


def parse_output(output: str) -> LlamaEstimate:
    """The final estimate in llama-perplexity's output (stdout and stderr together)."""
    final = FINAL.search(output)
    if final is None:
        short = TOO_SHORT.search(output)
        if short:
            raise LlamaPerplexityError(f"llama-perplexity needs at least {short[1]} tokens for a context of "
                                       f"{short[2]}: pass a longer text or a smaller --ctx")
        lines = [line.strip() for line in output.splitlines() if line.strip()]
        raise LlamaPerplexityError(f"llama-perplexity printed no final estimate; its last line: "
                                   f"{lines[-1][:200] if lines else '(none)'}")
    chunks = CHUNKS.search(output)
    return LlamaEstimate(float(final[1]), float(final[2]),
                         int(chunks[1]) if chunks else None, int(chunks[2]) if chunks else None)


def llama_command(binary: str, gguf: str, text_file: str, ctx: int, chunks: int, threads: int) -> list[str]:
    return [binary, "-m", gguf, "-f", text_file, "-c", str(ctx), "--chunks", str(chunks), "-t", str(threads)]


def check_inputs(binary: str, gguf: str | None) -> None:
    """Raise LlamaPerplexityError for a tool that is not there or a model file that is missing."""
    if not gguf:
        raise LlamaPerplexityError("--llama-perplexity needs --model-file GGUF (the model the server serves)")
    if not (Path(binary).is_file() and os.access(binary, os.X_OK)):
        raise LlamaPerplexityError(f"--llama-perplexity {binary} is not an executable file "
                                   "(bench/peers/build_llama_server.sh builds .peers/llama.cpp/bin/llama-perplexity)")
    if not Path(gguf).is_file():
        raise LlamaPerplexityError(f"--model-file {gguf} is not a file")


def run_llama_perplexity(command: list[str], timeout_s: float = 3600.0) -> tuple[LlamaEstimate, float]:
    """Run the tool to the end; its estimate and the seconds it took."""
    start = time.perf_counter()
    try:
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              errors="replace", timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LlamaPerplexityError(f"llama-perplexity did not run to the end: {exc}") from None
    seconds = time.perf_counter() - start
    estimate = parse_output(done.stdout)
    if done.returncode != 0:
        raise LlamaPerplexityError(f"llama-perplexity exited {done.returncode}")
    return estimate, seconds
