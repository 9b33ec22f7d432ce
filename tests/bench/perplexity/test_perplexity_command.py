"""`kvstrata bench perplexity`: bad input exits 2 with one line, and a whole run against a real kvstrata server
on the tiny random-weight model, checked against the same windows scored by transformers."""
from __future__ import annotations

import json
import math
from pathlib import Path

import httpx
import pytest

from kvstrata.bench.paths import REPO
from kvstrata.cli import main
from kvstrata.serving.ports import free_port
from kvstrata.serving.server import ServerThread

TEXT = REPO / "bench" / "texts" / "alice-chapters-1-7.txt"
MAX_MODEL_LEN = 1024  # the tiny_server fixture's (tests/bench/conftest.py)


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err and err.startswith("kvstrata bench perplexity: "), err
    return err


@pytest.mark.parametrize(("argv", "said"), [
    (["no/such/file.txt"], "no/such/file.txt is not a file"),
    ([str(TEXT), "--ctx", "15"], "--ctx must be >= 16"),
    ([str(TEXT), "--max-windows", "0"], "--max-windows must be >= 1"),
    ([str(TEXT), "--llama-perplexity", "/bin/true"], "needs --model-file"),
    ([str(TEXT), "--llama-perplexity", "no/such/llama-perplexity", "--model-file", str(TEXT)], "not an executable"),
])
def test_bad_input_exits_2_before_any_request(argv: list[str], said: str, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()  # nothing listens: a request would fail otherwise
    assert main(["bench", "perplexity", *argv, "--url", f"http://127.0.0.1:{port}", "--out-dir", str(tmp_path)]) == 2
    assert said in one_line_error(capsys)
    assert not list(tmp_path.iterdir())


def test_a_server_that_is_down_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["bench", "perplexity", str(TEXT), "--url", url, "--model", "m", "--out-dir", str(tmp_path)]) == 2
    assert f"cannot reach {url}/tokenize" in one_line_error(capsys)


def test_a_server_refusing_a_request_exits_2_with_its_message(tiny_server: ServerThread, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    # a window longer than the server's context is refused with a 4xx, whatever the server supports
    code = main(["bench", "perplexity", str(TEXT), "--url", tiny_server.base_url, "--ctx", str(2 * MAX_MODEL_LEN),
                 "--out-dir", str(tmp_path)])
    assert code == 2
    err = one_line_error(capsys)
    assert " answered 4" in err, err
    assert not list(tmp_path.iterdir())


def transformers_perplexity(model_dir: Path, ids: list[int], ctx: int, windows: int) -> float:
    """The rule worked out with transformers: back-to-back windows, positions ctx//2+1 .. ctx-1 scored."""
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float32).eval()
    nll, count = 0.0, 0
    with torch.no_grad():
        for k in range(windows):
            window = torch.tensor([ids[k * ctx:(k + 1) * ctx]])
            logp = torch.log_softmax(model(window).logits[0].double(), dim=-1)  # [ctx, vocab]
            for j in range(ctx // 2 + 1, ctx):
                nll -= float(logp[j - 1, window[0, j]])
                count += 1
    return math.exp(nll / count)


def test_a_run_against_a_real_server_matches_transformers(tiny_server: ServerThread, tiny_model_dir: Path,
                                                          tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # needs the server's /tokenize and echo + logprobs on /v1/completions
    ctx, windows = 64, 3
    code = main(["bench", "perplexity", str(TEXT), "--url", tiny_server.base_url, "--ctx", str(ctx),
                 "--max-windows", str(windows), "--out-dir", str(tmp_path)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    [out] = tmp_path.glob("perplexity-*.json")
    report = json.loads(out.read_text())
    server = report["server"]
    assert report["file"] == "bench/texts/alice-chapters-1-7.txt" and "machine" in report
    assert server["special_prefix"] == []  # SmolLM2's tokenizer adds no BOS
    assert (server["windows"], server["tokens_scored"]) == (windows, windows * (ctx - ctx // 2 - 1))
    ids = httpx.post(tiny_server.base_url + "/tokenize", json={"prompt": TEXT.read_text()}, timeout=60).json()["tokens"]
    assert server["text_tokens"] == len(ids)
    expected = transformers_perplexity(tiny_model_dir, ids, ctx, windows)
    assert server["perplexity"] == pytest.approx(expected, rel=1e-3)
    assert f"PPL = {server['perplexity']:.4f}" in captured.out
