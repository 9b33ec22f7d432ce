"""Reading llama.cpp's `llama-perplexity` output: real captured runs (SmolLM2-135M-Instruct Q4_1 on
bench/texts/alice-chapters-1-7.txt, stdout and stderr together), and the subprocess wrapper."""
from __future__ import annotations

from pathlib import Path

import pytest

from kvstrata.bench.perplexity.llama import (LlamaPerplexityError, check_inputs, llama_command, parse_output,
                                             run_llama_perplexity)
from kvstrata.bench.paths import REPO

HERE = Path(__file__).parent
TEXT = REPO / "bench" / "texts" / "alice-chapters-1-7.txt"


def test_the_final_estimate_of_a_real_run() -> None:
    # `-c 512 --chunks 4`: its running values end [4]20.4988, and the final line repeats it with the error bar
    estimate = parse_output((HERE / "llama_perplexity_c512_chunks4.txt").read_text())
    assert (estimate.perplexity, estimate.error, estimate.chunks, estimate.ctx) == (20.4988, 1.66841, 4, 512)


def test_the_final_estimate_sharing_a_line_with_the_eta() -> None:
    # without a terminal the ETA's "minutes" goes to stdout and the next stderr line joins the ETA's line
    out = ("0.00.228.790 I perplexity: calculating perplexity over 4 chunks, n_ctx=512, batch_size=2048, n_seq=4\n"
           "0.06.124.139 I perplexity: 5.90 seconds per pass - ETA 0.06.228.111 I Final estimate: PPL = 20.4988 "
           "+/- 1.66841\n")
    assert parse_output(out).perplexity == 20.4988


def test_a_text_too_short_for_the_context_says_so() -> None:
    # the tool exits 0 here, printing only an error: the parser is what notices
    with pytest.raises(LlamaPerplexityError, match="at least 1024 tokens for a context of 512"):
        parse_output((HERE / "llama_perplexity_too_short.txt").read_text())
    with pytest.raises(LlamaPerplexityError, match="no final estimate; its last line: main: error"):
        parse_output("llama_model_load: error\nmain: error: unable to load model\n")


def test_missing_tool_or_model_file_is_refused_before_running(tmp_path: Path) -> None:
    with pytest.raises(LlamaPerplexityError, match="needs --model-file"):
        check_inputs("/bin/true", None)
    with pytest.raises(LlamaPerplexityError, match="not an executable"):
        check_inputs(str(tmp_path / "nope"), str(TEXT))
    with pytest.raises(LlamaPerplexityError, match="is not a file"):
        check_inputs("/bin/true", str(tmp_path / "model.gguf"))


def test_running_a_tool_reads_what_it_prints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The subprocess wrapper on a stand-in that prints a captured run (the real tool is built by `make
    bench-peers`, which the test suite does not run): the estimate, and a failing exit code, reach the caller."""
    script = tmp_path / "llama-perplexity"
    captured = HERE / "llama_perplexity_c512_chunks4.txt"
    script.write_text(f"#!/bin/sh\ncat '{captured}'\nexit ${{EXIT:-0}}\n")
    script.chmod(0o755)
    command = llama_command(str(script), str(captured), str(TEXT), 512, 4, 2)
    assert command[1:] == ["-m", str(captured), "-f", str(TEXT), "-c", "512", "--chunks", "4", "-t", "2"]
    estimate, seconds = run_llama_perplexity(command)
    assert estimate.perplexity == 20.4988 and seconds > 0
    monkeypatch.setenv("EXIT", "3")
    with pytest.raises(LlamaPerplexityError, match="exited 3"):
        run_llama_perplexity(command)
