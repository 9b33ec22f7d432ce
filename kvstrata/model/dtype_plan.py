"""`--dtype auto`: the dtype of each phase, chosen from what this CPU computes fast.

Prefill is GEMM-bound, so its dtype is whichever GEMM is faster here:
- x86 with `avx512_bf16` or `amx_bf16`: bfloat16 (native bf16 dot products; a few times float32's
  GFLOP/s: docs/cpu-kernels.md);
- any other x86 (AVX2, plain AVX-512): float32. torch's bf16 GEMM has no native instructions to use
  there and runs many times slower than float32 (docs/cpu-kernels.md);
- other CPUs (Arm, ...), whose flags say less: a cached micro-benchmark of both (cpu_caps.py),
  bfloat16 when it reaches `BF16_MIN_RATIO` of float32.
Decode steps of a few rows are bound by weight reads, so both plans run them on the GGUF's 4-bit
weights (`--q4-decode auto` = on; quant/plan.py).
CUDA keeps bfloat16 (float16 where the GPU has no bf16). An explicit `--dtype` always wins, and then
`--q4-decode auto` keeps its meaning (on for bfloat16 only, so float32 stays transformers-exact).
`kvstrata dtype-plan` prints the decision for the host (`--peer-dtype`: only
the dtype a peer server should get).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kvstrata.model.cpu_caps import CpuInfo, GemmSpeeds, gemm_speeds, read_cpu_info

BF16_FLAGS = ("avx512_bf16", "amx_bf16")
BF16_MIN_RATIO = 0.9  # bf16 GEMM at least this fraction of float32's GFLOP/s (it also halves bytes)


@dataclass(frozen=True)
class DtypePlan:
    dtype: str  # weights, activations of prefill (and dense steps), KV pool
    q4_auto: bool  # what `--q4-decode auto` means under this plan
    source: str  # explicit | cuda | cpu_flags | benchmark
    reason: str

    def log_line(self, cpu: CpuInfo | None, int4_decode: bool) -> str:
        """One key=value line for the startup log."""
        decode = "quantized" if int4_decode else self.dtype
        fields = [f"dtype={self.dtype}", f"prefill={self.dtype}", f"decode={decode}", f"source={self.source}",
                  f"reason={self.reason}"]
        if cpu is not None:
            fields.append(f"cpu_model={cpu.model.replace(' ', '_')!s}")
            fields += [f"{flag}={int(on)}" for flag, on in cpu.speed_flags().items() if flag in ("avx2", "avx512f", *BF16_FLAGS)]
        return "dtype_plan " + " ".join(fields)


def bf16_fast_from_flags(cpu: CpuInfo) -> bool | None:
    """True/False where the CPU flags decide bf16 GEMM speed (x86), None where they do not."""
    if not cpu.is_x86:
        return None
    return any(flag in cpu.flags for flag in BF16_FLAGS)


def plan_cpu(cpu: CpuInfo, speeds: Callable[[], GemmSpeeds]) -> DtypePlan:
    fast = bf16_fast_from_flags(cpu)
    if fast is not None:
        source = "cpu_flags"
        reason = "native_bf16" if fast else "no_avx512_bf16_or_amx_bf16"
    else:
        measured = speeds()
        fast = measured.bf16_ratio >= BF16_MIN_RATIO
        source = "benchmark"
        reason = f"bf16_{measured.bfloat16_gflops:.1f}_vs_float32_{measured.float32_gflops:.1f}_gflops"
    return DtypePlan("bfloat16" if fast else "float32", True, source, reason)


def plan_dtype(
    requested: str,
    device: str = "cpu",
    cpu: CpuInfo | None = None,
    speeds: Callable[[], GemmSpeeds] | None = None,
    home: Path | None = None,
) -> DtypePlan:
    """The plan for `--dtype requested` on `device`. `cpu` and `speeds` default to the host's
    (the benchmark cached under `home`, default $KVSTRATA_HOME)."""
    if requested != "auto":
        return DtypePlan(requested, requested == "bfloat16", "explicit", "dtype_flag")
    if not device.startswith("cpu"):
        return DtypePlan(_gpu_dtype(device), False, "cuda", "gpu")
    info = cpu or read_cpu_info()
    if speeds is None:
        import torch

        from kvstrata.model.fetch import model_home

        where = home or model_home()
        threads = torch.get_num_threads()
        speeds = lambda: gemm_speeds(info, where, threads)  # noqa: E731 - measured only if needed
    return plan_cpu(info, speeds)


def _gpu_dtype(device: str) -> str:
    import torch

    try:
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    except (RuntimeError, AssertionError):  # no CUDA here: the engine reports the bad device itself
        return "bfloat16"


def peer_dtype(device: str = "cpu") -> str:
    """The `--dtype` to start a peer server (vLLM) with: the same choice as ours for prefill."""
    return plan_dtype("auto", device).dtype

