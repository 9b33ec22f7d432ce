"""dtype_plan: `--dtype auto` from fake CPU flags (and a fake micro-benchmark where flags say nothing)."""
from __future__ import annotations

from pathlib import Path

import pytest

from kvstrata.model.cpu_caps import CpuInfo, GemmSpeeds
from kvstrata.model.dtype_plan import plan_dtype


def cpu(flags: str, machine: str = "x86_64") -> CpuInfo:
    return CpuInfo("Fake CPU", frozenset(flags.split()), machine, 2, "9.9.9")


def no_benchmark() -> GemmSpeeds:
    raise AssertionError("flags decide on x86: no micro-benchmark")


@pytest.mark.parametrize("flags,dtype", [
    ("sse2 avx avx2 fma", "float32"),  # AVX2-only EPYC: bf16 GEMM ~100x slower
    ("sse2 avx2 avx512f avx512_vnni", "float32"),  # AVX-512 without bf16
    ("sse2 avx2 avx512f avx512_bf16", "bfloat16"),
    ("sse2 avx2 avx512f amx_tile amx_bf16", "bfloat16"),
])
def test_x86_flags_decide(flags: str, dtype: str) -> None:
    plan = plan_dtype("auto", "cpu", cpu=cpu(flags), speeds=no_benchmark)
    assert (plan.dtype, plan.source, plan.q4_auto) == (dtype, "cpu_flags", True)


@pytest.mark.parametrize("f32,bf16,dtype", [(100.0, 250.0, "bfloat16"), (100.0, 95.0, "bfloat16"), (100.0, 3.0, "float32")])
def test_other_cpus_use_the_benchmark(f32: float, bf16: float, dtype: str) -> None:
    plan = plan_dtype("auto", "cpu", cpu=cpu("fp asimd bf16", "aarch64"), speeds=lambda: GemmSpeeds(f32, bf16))
    assert (plan.dtype, plan.source) == (dtype, "benchmark")
    assert f"bf16_{bf16:.1f}_vs" in plan.reason


@pytest.mark.parametrize("requested", ["float32", "bfloat16", "float16"])
def test_explicit_dtype_wins(requested: str) -> None:
    plan = plan_dtype(requested, "cpu", cpu=cpu("avx2 avx512_bf16"), speeds=no_benchmark)
    assert plan.dtype == requested and plan.source == "explicit"
    assert plan.q4_auto == (requested == "bfloat16")  # explicit float32 stays transformers-exact


def test_cuda_keeps_a_gpu_dtype() -> None:
    plan = plan_dtype("auto", "cuda:0", cpu=cpu("avx2"), speeds=no_benchmark)
    assert plan.dtype in ("bfloat16", "float16") and plan.source == "cuda" and not plan.q4_auto


def test_log_line_is_key_value() -> None:
    c = cpu("avx2 fma")
    line = plan_dtype("auto", cpu=c, speeds=no_benchmark).log_line(c, int4_decode=True)
    fields = dict(f.split("=", 1) for f in line.split()[1:])
    assert line.startswith("dtype_plan ")
    assert fields["dtype"] == "float32" and fields["prefill"] == "float32" and fields["decode"] == "quantized"
    assert fields["avx2"] == "1" and fields["avx512_bf16"] == "0" and fields["cpu_model"] == "Fake_CPU"


def test_engine_on_auto_logs_the_plan(tiny_model_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The real engine on this machine: the plan decides the dtype it runs and logs it."""
    import logging

    from kvstrata import LLM
    from kvstrata.model.cpu_caps import read_cpu_info

    expected = plan_dtype("auto", cpu=read_cpu_info()).dtype
    with caplog.at_level(logging.INFO, logger="kvstrata.engine.model_loader"):
        llm = LLM(str(tiny_model_dir), max_total_tokens=64)
    assert llm.engine.info.dtype == expected
    assert any(r.getMessage().startswith(f"dtype_plan dtype={expected} ") for r in caplog.records)


def test_cli_prints_the_plan_and_the_peer_dtype(capsys: pytest.CaptureFixture[str]) -> None:
    from kvstrata.cli import main

    assert main(["dtype-plan"]) == 0
    assert capsys.readouterr().out.startswith("dtype_plan dtype=")
    assert main(["dtype-plan", "--peer-dtype"]) == 0
    assert capsys.readouterr().out.strip() in ("float32", "bfloat16", "float16")
