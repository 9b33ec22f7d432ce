"""cpu_caps: /proc/cpuinfo parsing, the report fields, and the micro-benchmark's JSON cache."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvstrata.cli import main
from kvstrata.model import cpu_kernels
from kvstrata.model.cpu_caps import (
    CACHE_FILE,
    CpuInfo,
    CpuIsaError,
    GemmSpeeds,
    capped_flags,
    gemm_speeds,
    isa_cap,
    measure_gemm,
    parse_cpuinfo,
    read_cpu_info,
)
from kvstrata.model.dtype_plan import plan_dtype

X86 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse2 avx f16c fma avx2 bmi2

processor\t: 1
model name\t: other
flags\t\t: avx512f
"""
ARM = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm bf16 sve
CPU part\t: 0xd40
"""


def cpu(flags: str, machine: str = "x86_64", model: str = "Test CPU") -> CpuInfo:
    return CpuInfo(model, frozenset(flags.split()), machine, 2, "9.9.9")


def test_parse_cpuinfo_reads_the_first_processor() -> None:
    model, flags = parse_cpuinfo(X86)
    assert model == "AMD EPYC 7B13"
    assert {"avx2", "fma", "sse2"} <= flags and "avx512f" not in flags
    model, flags = parse_cpuinfo(ARM)
    assert model == "" and {"asimd", "bf16", "sve"} <= flags


def test_read_cpu_info_from_a_file_and_a_missing_one(tmp_path: Path) -> None:
    f = tmp_path / "cpuinfo"
    f.write_text(X86)
    info = read_cpu_info(str(f))
    assert info.model == "AMD EPYC 7B13" and "avx2" in info.flags and info.cores >= 1
    missing = read_cpu_info(str(tmp_path / "nope"))
    assert missing.flags == frozenset() and missing.model


def test_report_lists_only_speed_flags() -> None:
    info = cpu("sse2 avx2 fma avx512f avx512_bf16 amx_bf16 amx_tile bmi2")
    r = info.report()
    assert r["cpu_model"] == "Test CPU" and r["torch_version"] == "9.9.9" and r["cpu_cores"] == 2
    assert r["cpu_flags"] == ["amx_bf16", "amx_tile", "avx2", "avx512_bf16", "avx512f", "fma"]
    assert "avx512_bf16" in info.summary() and "torch 9.9.9" in info.summary()
    assert cpu("avx2").speed_flags()["avx2"] and not cpu("avx2").speed_flags()["avx512_bf16"]


def test_gemm_speeds_measures_once_then_reads_the_cache(tmp_path: Path) -> None:
    calls: list[int] = []

    def fake() -> GemmSpeeds:
        calls.append(1)
        return GemmSpeeds(100.0, 2.0)

    info = cpu("asimd", machine="aarch64")
    assert gemm_speeds(info, tmp_path, 2, fake) == GemmSpeeds(100.0, 2.0)
    assert gemm_speeds(info, tmp_path, 2, fake) == GemmSpeeds(100.0, 2.0)
    assert len(calls) == 1
    stored = json.loads((tmp_path / CACHE_FILE).read_text())
    (entry,) = stored.values()
    assert entry["float32_gflops"] == 100.0 and entry["cpu_model"] == "Test CPU" and entry["threads"] == 2
    # another thread count, CPU or torch is another key; the first entry stays
    gemm_speeds(info, tmp_path, 1, fake)
    gemm_speeds(CpuInfo("Test CPU", info.flags, "aarch64", 2, "10.0"), tmp_path, 2, fake)
    assert len(calls) == 3 and len(json.loads((tmp_path / CACHE_FILE).read_text())) == 3


def test_a_corrupt_cache_is_measured_again_and_rewritten(tmp_path: Path) -> None:
    (tmp_path / CACHE_FILE).write_text("{not json")
    info = cpu("asimd", machine="aarch64")
    assert gemm_speeds(info, tmp_path, 2, lambda: GemmSpeeds(5.0, 10.0)).bf16_ratio == 2.0
    assert gemm_speeds(info, tmp_path, 2, lambda: GemmSpeeds(0.0, 0.0)) == GemmSpeeds(5.0, 10.0)
    (tmp_path / CACHE_FILE).write_text(json.dumps({info.cache_key(2): {"float32_gflops": "x"}}))
    assert gemm_speeds(info, tmp_path, 2, lambda: GemmSpeeds(7.0, 1.0)) == GemmSpeeds(7.0, 1.0)


def test_measure_gemm_returns_positive_rates() -> None:
    s = measure_gemm(rows=8, k=64, n=64, reps=1)
    assert s.float32_gflops > 0 and s.bfloat16_gflops > 0


ZEN4 = X86.replace("fpu sse2 avx f16c fma avx2 bmi2", "fpu sse2 avx f16c fma avx2 bmi2 avx512f avx512bw avx512_vnni "
                   "avx512_bf16 avx512vl avx_vnni amx_tile amx_bf16")


def test_an_avx2_cap_drops_every_flag_above_x86_64_v3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "cpuinfo"
    f.write_text(ZEN4)
    assert "avx512_bf16" in read_cpu_info(str(f)).flags and isa_cap() == "native"
    monkeypatch.setenv("KVSTRATA_CPU_ISA", " AVX2 ")
    info = read_cpu_info(str(f))
    assert isa_cap() == "avx2" and info.model == "AMD EPYC 7B13 [KVSTRATA_CPU_ISA=avx2]"
    assert info.flags == frozenset("fpu sse2 avx f16c fma avx2 bmi2".split())
    # the plan and the kernels' build follow: float32 prefill, int4 decode, x86-64-v3 code
    plan = plan_dtype("auto", cpu=info)
    assert (plan.dtype, plan.q4_auto, plan.reason) == ("float32", True, "no_avx512_bf16_or_amx_bf16")
    assert "-march=x86-64-v3" in cpu_kernels.cflags() and "-march=native" not in cpu_kernels.cflags()
    monkeypatch.delenv("KVSTRATA_CPU_ISA")
    assert cpu_kernels.cflags()[-1] == "-march=native"


def test_a_cap_this_cpu_is_below_or_an_unknown_one_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(CpuIsaError, match="lacks fma, f16c"):
        capped_flags(frozenset({"sse2", "avx2"}), "avx2")
    assert capped_flags(frozenset({"avx512f"}), "native") == frozenset({"avx512f"})
    monkeypatch.setenv("KVSTRATA_CPU_ISA", "avx9")
    with pytest.raises(CpuIsaError, match="must be one of native, avx2"):
        isa_cap()


def test_the_cli_says_what_is_wrong_with_the_cap(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("KVSTRATA_CPU_ISA", "avx9")
    with pytest.raises(SystemExit) as stop:
        main(["dtype-plan"])
    assert stop.value.code == 2 and "KVSTRATA_CPU_ISA='avx9': must be one of native, avx2" in capsys.readouterr().err
