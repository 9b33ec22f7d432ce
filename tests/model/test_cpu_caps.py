"""cpu_caps: /proc/cpuinfo parsing, the report fields, and the micro-benchmark's JSON cache."""
from __future__ import annotations

import json
from pathlib import Path

from kvstrata.model.cpu_caps import CACHE_FILE, CpuInfo, GemmSpeeds, gemm_speeds, measure_gemm, parse_cpuinfo, read_cpu_info

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
