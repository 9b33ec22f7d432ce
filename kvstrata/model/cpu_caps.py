"""What this CPU is and how fast torch multiplies on it: the facts `--dtype auto` and bench reports use.

`read_cpu_info()` parses /proc/cpuinfo (x86 `flags`, Arm `Features`) into the CPU model and the
flags that decide matmul speed. `gemm_speeds()` is a startup micro-benchmark (bfloat16 vs float32
GFLOP/s of one prefill-shaped matmul), cached as JSON in $KVSTRATA_HOME/cpu_caps.json under a key
made of the CPU model, its flags, the thread count and the torch version, so it runs once per
machine and torch; it is only consulted where the flags cannot decide (dtype_plan.py).

`KVSTRATA_CPU_ISA=avx2` makes an AVX-512 machine plan and build as an AVX2-only one would (the
x86-64-v3 level: avx2, fma, f16c; no AVX-512, AMX or AVX-VNNI): every flag above it is dropped from
the flags read here, the C++ kernels are compiled with -march=x86-64-v3 (cpu_kernels.py), and the
model name says so in every bench record. It is for testing and measuring the AVX2 paths on a
bigger CPU; torch's own kernels follow only with ATEN_CPU_CAPABILITY=avx2 and ONEDNN_MAX_CPU_ISA=AVX2
set before it starts.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger(__name__)

# flags that change matmul speed: x86 vector widths and native bf16/AMX; Arm SIMD, SVE and bf16
SPEED_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16",
               "asimd", "sve", "bf16")
CACHE_FILE = "cpu_caps.json"
ISA_ENV = "KVSTRATA_CPU_ISA"
ISA_CAPS = ("native", "avx2", "portable")
AVX2_NEEDS = ("avx2", "fma", "f16c")  # x86-64-v3's vector part: what -march=x86-64-v3 code uses
ABOVE_AVX2 = ("avx512", "amx", "avx_vnni", "avx_ifma", "avx_ne_convert")  # flag prefixes an AVX2 cap drops


class CpuIsaError(ValueError):
    """KVSTRATA_CPU_ISA holds a value kvstrata does not know, or a level this CPU lacks."""


def isa_cap() -> str:
    """KVSTRATA_CPU_ISA: "native" (the default: whatever the CPU has), "avx2", or "portable" (x86-64's
    baseline: no AVX at all, so the kernels' portable loops run, as on a CPU without AVX2)."""
    value = os.environ.get(ISA_ENV, "").strip().lower() or "native"
    if value not in ISA_CAPS:
        raise CpuIsaError(f"{ISA_ENV}={value!r}: must be one of {', '.join(ISA_CAPS)}")
    return value


def capped_flags(flags: frozenset[str], cap: str) -> frozenset[str]:
    """`flags` as a CPU at ISA level `cap` would list them (CpuIsaError if this one is below it)."""
    if cap == "native":
        return flags
    if cap == "portable":
        return frozenset(f for f in flags if not f.startswith(("avx", "amx", "fma", "f16c", "vaes", "vpclmul")))
    missing = [f for f in AVX2_NEEDS if f not in flags]
    if missing:
        raise CpuIsaError(f"{ISA_ENV}={cap}: this CPU lacks {', '.join(missing)}")
    return frozenset(f for f in flags if not f.startswith(ABOVE_AVX2))


@dataclass(frozen=True)
class CpuInfo:
    model: str
    flags: frozenset[str]
    machine: str  # platform.machine(): x86_64, aarch64, ...
    cores: int
    torch_version: str

    @property
    def is_x86(self) -> bool:
        return self.machine.lower() in ("x86_64", "amd64", "i686", "x86") or "avx" in self.flags or "sse2" in self.flags

    def speed_flags(self) -> dict[str, bool]:
        return {f: f in self.flags for f in SPEED_FLAGS}

    def report(self) -> dict[str, Any]:
        """What a benchmark result records about the machine."""
        return {
            "cpu_model": self.model,
            "cpu_machine": self.machine,
            "cpu_cores": self.cores,
            "cpu_flags": sorted(f for f in SPEED_FLAGS if f in self.flags),
            "torch_version": self.torch_version,
        }

    def summary(self) -> str:
        """One line for Markdown: model, cores, speed flags present, torch."""
        flags = ",".join(sorted(f for f in SPEED_FLAGS if f in self.flags)) or "none"
        return f"{self.model} ({self.machine}, {self.cores} cores; flags {flags}; torch {self.torch_version})"

    def cache_key(self, threads: int) -> str:
        raw = "|".join([self.model, self.machine, ",".join(sorted(self.flags)), str(threads), self.torch_version])
        return hashlib.sha256(raw.encode()).hexdigest()[:24]


def parse_cpuinfo(text: str) -> tuple[str, frozenset[str]]:
    """(model name, flags) of the first processor block of /proc/cpuinfo text."""
    model, flags = "", ""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip().lower(), value.strip()
        if key in ("model name", "cpu model", "hardware") and not model:
            model = value
        elif key in ("flags", "features") and not flags:
            flags = value
    return model, frozenset(flags.lower().split())


def read_cpu_info(path: str = "/proc/cpuinfo") -> CpuInfo:
    import torch

    try:
        model, flags = parse_cpuinfo(Path(path).read_text(errors="replace"))
    except OSError:
        model, flags = "", frozenset()
    model = model or platform.processor() or "unknown"
    cap = isa_cap()
    if cap != "native":
        flags = capped_flags(flags, cap)
        model = f"{model} [{ISA_ENV}={cap}]"
    return CpuInfo(model, flags, platform.machine() or "unknown", os.cpu_count() or 1, torch.__version__)


@dataclass(frozen=True)
class GemmSpeeds:
    float32_gflops: float
    bfloat16_gflops: float

    @property
    def bf16_ratio(self) -> float:
        return self.bfloat16_gflops / max(self.float32_gflops, 1e-9)


def measure_gemm(rows: int = 128, k: int = 576, n: int = 1536, reps: int = 3) -> GemmSpeeds:
    """GFLOP/s of x[rows, k] @ w[n, k].T in float32 and bfloat16 (best of `reps`), ~0.1-0.5 s."""
    import torch

    def best(dtype: torch.dtype) -> float:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(rows, k, generator=gen).to(dtype)
        w = torch.randn(n, k, generator=gen).to(dtype)
        torch.nn.functional.linear(x, w)  # warm-up
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            torch.nn.functional.linear(x, w)
            times.append(time.perf_counter() - t)
        return 2 * rows * k * n / max(min(times), 1e-9) / 1e9

    return GemmSpeeds(best(torch.float32), best(torch.bfloat16))


def gemm_speeds(
    info: CpuInfo, home: Path, threads: int, measure: Callable[[], GemmSpeeds] = measure_gemm
) -> GemmSpeeds:
    """The cached micro-benchmark for this CPU/threads/torch, measuring (and caching) on a miss.
    An unreadable or corrupt cache is measured again and rewritten; an unwritable one only logged."""
    path = home / CACHE_FILE
    key = info.cache_key(threads)
    entries: dict[str, Any] = {}
    try:
        loaded = json.loads(path.read_text())
        entries = loaded if isinstance(loaded, dict) else {}
        hit = entries.get(key)
        if isinstance(hit, dict):
            return GemmSpeeds(float(hit["float32_gflops"]), float(hit["bfloat16_gflops"]))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    speeds = measure()
    entries[key] = {"float32_gflops": speeds.float32_gflops, "bfloat16_gflops": speeds.bfloat16_gflops,
                    "threads": threads, **info.report()}
    try:
        home.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(entries, indent=2) + "\n")
        tmp.replace(path)
    except OSError as exc:
        log.warning("cpu_caps cache not written path=%s error=%s", path, exc)
    return speeds
