"""What the agent CLI tests share: a tiny Qwen3-shaped model whose replies end by themselves, and a real
`kvstrata serve` subprocess on a free loopback port.

The agents send 10-20k-token prompts and up to 32k max_tokens, and treat a reply cut by max_tokens as an
error. A random-weight model never says its end-of-turn token (1 in 49k a token), so this one is rigged:
every token's embedding carries a constant in dimension 0 that no layer writes to, and the LM head reads
that dimension for the end-of-turn token only, at a logit of about `EOS_LOGIT`. Sampled at temperature 1
(what the agents send), a reply ends after ~7 tokens on average; everything else is random weights.
"""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx

AGENTS_BIN = Path(__file__).resolve().parents[2] / ".agents" / "node_modules" / ".bin"  # make agent-deps
EOS_ID = 2  # SmolLM2's <|im_end|>
EOS_LOGIT = 9.0
CONTEXT = 32768


def write_agent_model(out: Path, tokenizer_from: Path) -> Path:
    """A 2-layer random Qwen3 of `CONTEXT` positions (SmolLM2's tokenizer and template) that ends its replies."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=CONTEXT, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=EOS_ID,
    ))
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 4.0
        for layer in model.model.layers:  # nothing writes dimension 0 of the residual stream
            layer.self_attn.o_proj.weight[0, :] = 0
            layer.mlp.down_proj.weight[0, :] = 0
        model.lm_head.weight[:, 0] = 0
        hidden = model.model(torch.randint(3, 49152, (1, 64))).last_hidden_state[0, :, 0]  # ~8 after the norm
        model.lm_head.weight[EOS_ID, 0] = EOS_LOGIT / hidden.mean()
    model.save_pretrained(out)
    tok = AutoTokenizer.from_pretrained(str(tokenizer_from.parent), gguf_file=tokenizer_from.name)
    tok.save_pretrained(out)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def kvstrata_serve(model: Path, *args: str, name: str = "agent-model", context: int | None = CONTEXT,
                   start_timeout_s: float = 120) -> Iterator[str]:
    """`kvstrata serve --model MODEL [--max-model-len CONTEXT] ARGS` on a free port; yields its base URL
    once /health is 200."""
    port = _free_port()
    cmd = [sys.executable, "-m", "kvstrata.cli", "serve", "--model", str(model), "--served-model-name", name,
           "--port", str(port), *(["--max-model-len", str(context)] if context else []), *args]
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:  # bounded: a broken start fails the test instead of hanging it
            assert proc.poll() is None, "kvstrata serve exited"
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "kvstrata serve did not become ready"
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
