"""The peers under the AVX2 cap (KVSTRATA_CPU_ISA=avx2, docs/cpu-kernels.md): llama.cpp's AVX2-only binary, and
vLLM told by bench/peers/avx2cap/sitecustomize.py that the CPU has no AVX-512 (it picks its kernel
library from torch.cpu's checks, which read the hardware)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvstrata.bench.compare import engines


def test_llama_server_binary_follows_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVSTRATA_CPU_ISA", raising=False)
    assert engines._llama_server() == ".peers/llama.cpp/bin/llama-server"
    monkeypatch.setenv("KVSTRATA_CPU_ISA", "avx2")
    assert engines._llama_server() == ".peers/llama.cpp-avx2/bin/llama-server"
    assert engines._llamacpp(8400, "m.gguf")[0].endswith(".peers/llama.cpp-avx2/bin/llama-server")
    monkeypatch.setenv("KVSTRATA_CPU_ISA", "avx9")  # refused by the CLI itself; never a crash here
    assert engines._llama_server() == ".peers/llama.cpp/bin/llama-server"


def test_the_vllm_sitecustomize_hides_avx512_from_torch_cpu() -> None:
    code = "import torch.cpu; print(torch.cpu._is_avx512_supported(), torch.cpu._is_avx512_bf16_supported())"
    path = str(engines.REPO / "bench/peers/avx2cap")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": path},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.split() == ["False", "False"], done.stderr[-2000:]
    script = (engines.REPO / "bench/peers/vllm_serve.sh").read_text()
    assert "bench/peers/avx2cap" in script and "KVSTRATA_CPU_ISA" in script


def test_every_engine_serves_the_compared_gguf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--model-file FILE`: kvstrata and llama.cpp get the file, vLLM the HF copy of it (SmolLM2's from
    `make bench-peers`, another model's written beside it on first use)."""
    from kvstrata.bench.args import default_tokenizer

    cmd = engines._kvstrata(8400, "models/x.gguf")
    assert cmd[cmd.index("--model") + 1] == "models/x.gguf" and cmd[cmd.index("--served-model-name") + 1] == "smollm2"
    assert engines._llamacpp(8400, "models/x.gguf")[2] == "models/x.gguf"
    assert engines.hf_copy(default_tokenizer()) == engines.REPO / ".peers/smollm2-hf"
    written: list[tuple[str, Path]] = []
    monkeypatch.setattr("kvstrata.bench.compare.export_hf.export_hf", lambda g, out: written.append((g, out)) or out)
    vllm = engines._vllm(8400, str(tmp_path / "llama-1b.gguf"))  # the command alone writes nothing
    assert vllm[vllm.index("--model") + 1] == str(engines.REPO / ".peers/llama-1b-hf") and not written
    assert engines.ENGINES["vllm"].prepare is engines.write_hf_copy
    assert engines.ENGINES["vllm-ngram"].prepare is engines.write_hf_copy
    nospec = engines.ENGINES["kvstrata-nospec"].argv(8400, "models/x.gguf", ["--speculative", "suffix", "--seed", "1"])
    assert nospec == [*cmd, "--speculative", "suffix", "--seed", "1", "--speculative", "off"]  # the last one counts
    act16 = engines.ENGINES["kvstrata-act16"].argv(8400, "models/x.gguf", ["--activation-bits", "8"])
    assert act16[len(cmd):] == ["--activation-bits", "8", "--activation-bits", "16"]
    assert engines.ENGINES["kvstrata"].argv(8400, "models/x.gguf", ["--seed", "1"]) == [*cmd, "--seed", "1"]
    ngram = engines.ENGINES["vllm-ngram"].command(8400, "models/x.gguf")
    assert json.loads(ngram[ngram.index("--speculative-config") + 1])["method"] == "ngram"
    suffix = engines.ENGINES["vllm-suffix"].command(8400, "models/x.gguf")
    assert json.loads(suffix[suffix.index("--speculative-config") + 1]) == {"method": "suffix"}
    assert suffix[:len(engines._vllm(8400, "models/x.gguf"))] == engines._vllm(8400, "models/x.gguf")
    engines.write_hf_copy(default_tokenizer())  # the default model's copy comes from `make bench-peers`
    engines.write_hf_copy(str(tmp_path / "llama-1b.gguf"))
    assert written == [(str(tmp_path / "llama-1b.gguf"), engines.REPO / ".peers/llama-1b-hf")]
