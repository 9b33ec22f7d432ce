"""The servers `kvstrata bench compare` starts in turn: how to launch each, wait for it, stop it.

Each engine gets both cores and the same model (the GGUF of `--tokenizer`/`--model-file`, SmolLM2-135M-Instruct
by default): kvstrata and llama.cpp from the GGUF,
vLLM CPU from the HF copy (`make bench-peers`, `bench/peers/vllm_serve.sh`, with `--dtype` from
kvstrata's own per-CPU choice, dtype_plan.py: float32 where bf16 GEMM is slow), llama.cpp's
`llama-server` from the GGUF (`.peers/llama.cpp/bin/llama-server`, docs/peers.md; `.peers/llama.cpp-avx2/`
under KVSTRATA_CPU_ISA=avx2, where vllm_serve.sh also makes vLLM load its AVX2 kernels; 8 slots of 4096
tokens, so the throughput probe's 8 decode streams run at once, as on the other engines). A
workload may add flags for an engine (`RunningServer(..., extra_args)`). A server runs in its own
process group, logging to a file, and is stopped with SIGINT, then SIGKILL; if `bench compare`
itself dies (even by SIGKILL) the kernel sends it SIGTERM (process_tree.py).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import httpx

from kvstrata.bench.paths import portable
from kvstrata.process_tree import pdeathsig_preexec

REPO = Path(__file__).resolve().parents[3]


class EngineUnavailable(RuntimeError):
    """A peer is not installed, or its server did not become healthy."""


@dataclass(frozen=True)
class EngineSpec:
    name: str
    command: Callable[[int, str], list[str]]  # (port, gguf path) -> argv
    needs: str  # a path that must exist, relative to the repo ("" = nothing)
    install_hint: str
    startup_timeout_s: float
    prepare: Callable[[str], None] | None = None  # run with the gguf path before the server starts
    pinned: tuple[str, ...] = ()  # what makes this engine itself: after --kvstrata-args, so they cannot undo it

    def argv(self, port: int, gguf: str, extra: Sequence[str] = ()) -> list[str]:
        """The server's command line: its command, the run's extra arguments (--kvstrata-args), then the
        pinned ones (argparse takes the last: `--kvstrata-args "--speculative suffix"` must not make
        kvstrata-nospec speculate)."""
        return [*self.command(port, gguf), *extra, *self.pinned]


def _kvstrata(port: int, gguf: str) -> list[str]:
    return [sys.executable, "-m", "kvstrata.cli", "serve", "--model", gguf, "--served-model-name", "smollm2",
            "--port", str(port), "--log-level", "warning"]


def hf_copy(gguf: str) -> Path:
    """The Hugging Face folder vLLM serves for `gguf`: .peers/smollm2-hf for the default model (`make
    bench-peers`), else .peers/<file stem>-hf (`write_hf_copy` makes it)."""
    from kvstrata.bench.args import default_tokenizer

    if Path(gguf).expanduser().resolve() == Path(default_tokenizer()).resolve():
        return REPO / ".peers/smollm2-hf"
    return REPO / ".peers" / f"{Path(gguf).stem}-hf"


def write_hf_copy(gguf: str) -> None:
    """Before vLLM starts on another GGUF than the default: its HF copy, exported once (the same weights,
    dequantized by transformers)."""
    from kvstrata.bench.compare.export_hf import export_hf

    out = hf_copy(gguf)
    if out != REPO / ".peers/smollm2-hf":
        export_hf(gguf, out)


def _vllm(port: int, gguf: str) -> list[str]:
    # vLLM CPU's default is bf16, ~100x slower GEMMs on CPUs without native bf16: give it our choice
    from kvstrata.model.dtype_plan import peer_dtype

    return [str(REPO / "bench/peers/vllm_serve.sh"), str(port), "--dtype", peer_dtype(), "--model", str(hf_copy(gguf))]


def _llama_server() -> str:
    """llama-server's path: under KVSTRATA_CPU_ISA=avx2 the AVX2-only build (build_llama_server.sh
    makes it under that cap), so the peer runs the same instruction set as we do."""
    from kvstrata.model.cpu_caps import CpuIsaError, isa_cap

    try:
        avx2 = isa_cap() == "avx2"
    except CpuIsaError:  # a bad value: the CLI stops on it before any engine starts
        avx2 = False
    return ".peers/llama.cpp-avx2/bin/llama-server" if avx2 else ".peers/llama.cpp/bin/llama-server"


def _llamacpp(port: int, gguf: str) -> list[str]:
    return [str(REPO / _llama_server()), "-m", gguf, "-c", "32768", "-np", "8",
            "-t", "2", "-tb", "2", "--no-webui", "--host", "127.0.0.1", "--port", str(port), "-a", "smollm2"]


# vLLM's model-free speculation: n-gram prompt lookup as the issue ran it, and SuffixDecoding at vLLM's defaults
# (a tree 24 deep, as many drafted tokens; arctic-inference's, bench/peers/build_arctic.sh)
VLLM_NGRAM = '{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
VLLM_SUFFIX = '{"method": "suffix"}'

ENGINES: dict[str, EngineSpec] = {
    "kvstrata": EngineSpec("kvstrata", _kvstrata, "", "", 300.0),
    "kvstrata-nospec": EngineSpec("kvstrata-nospec", _kvstrata, "", "", 300.0, pinned=("--speculative", "off")),
    # 16-bit integer activations (and prefill as without them): what --activation-bits auto ran before 8 bits
    "kvstrata-act16": EngineSpec("kvstrata-act16", _kvstrata, "", "", 300.0, pinned=("--activation-bits", "16")),
    # the scheduler before the slo policy: prompts by arrival, steps sized by tokens alone (docs/scheduling.md)
    "kvstrata-fcfs": EngineSpec("kvstrata-fcfs", _kvstrata, "", "", 300.0, pinned=("--scheduling-policy", "fcfs")),
    "vllm": EngineSpec("vllm", _vllm, ".peers/vllm/bin/python", "run `make bench-peers`", 600.0, write_hf_copy),
    "vllm-ngram": EngineSpec("vllm-ngram", lambda port, gguf: [*_vllm(port, gguf), "--speculative-config", VLLM_NGRAM],
                             ".peers/vllm/bin/python", "run `make bench-peers`", 600.0, write_hf_copy),
    "vllm-suffix": EngineSpec("vllm-suffix",
                              lambda port, gguf: [*_vllm(port, gguf), "--speculative-config", VLLM_SUFFIX],
                              ".peers/vllm/.arctic-inference", "run `make bench-peers`", 600.0, write_hf_copy),
    "llamacpp": EngineSpec("llamacpp", _llamacpp, _llama_server(),
                           "run bench/peers/build_llama_server.sh (docs/peers.md)", 300.0),
}


class RunningServer:
    """A started engine; use as a context manager so it is always stopped."""

    def __init__(
        self, spec: EngineSpec, port: int, gguf: str, log_path: Path, extra_args: Sequence[str] = ()
    ) -> None:
        if spec.needs and not (REPO / spec.needs).exists():
            raise EngineUnavailable(f"{spec.name}: {spec.needs} is missing; {spec.install_hint}")
        if spec.prepare is not None:
            spec.prepare(gguf)
        self.spec = spec
        self.url = f"http://127.0.0.1:{port}"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = log_path.open("w")
        self.proc = subprocess.Popen(
            spec.argv(port, gguf, extra_args), cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=pdeathsig_preexec,
        )
        self.log_path = log_path

    def wait_healthy(self) -> float:
        """Seconds until GET /health answered 200; raises EngineUnavailable if it died or timed out."""
        start = time.monotonic()
        while time.monotonic() - start < self.spec.startup_timeout_s:
            if self.proc.poll() is not None:
                raise EngineUnavailable(f"{self.spec.name} exited with {self.proc.returncode}; see {self.log_path}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return time.monotonic() - start
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        raise EngineUnavailable(f"{self.spec.name} not healthy after {self.spec.startup_timeout_s:.0f} s; see {self.log_path}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            for sig, wait_s in ((signal.SIGINT, 20), (signal.SIGKILL, 10)):
                try:
                    os.killpg(self.proc.pid, sig)
                    self.proc.wait(timeout=wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
                except ProcessLookupError:
                    break
        if not self._log.closed:
            self._log.close()
            # the server's own lines name the machine's paths (its caches, temp files): the kept log must not
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
            self.log_path.write_text("\n".join(portable(line) for line in text.split("\n")), encoding="utf-8")

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
