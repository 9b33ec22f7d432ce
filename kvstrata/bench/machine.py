"""The machine a bench result was measured on: CPU model, the flags that set its speed, torch.

Every bench command's JSON carries `"machine": machine_info()` (report.write_json, compare,
throughput, soak) and compare's Markdown has `machine_line()` beside the command, so a figure is never read
without knowing whether it came from an AVX2 CPU or one with native bf16 (dtype_plan.py).
"""
from __future__ import annotations

import functools
from typing import Any


@functools.lru_cache(maxsize=1)
def machine_info() -> dict[str, Any]:
    """CPU model, machine, cores, speed flags, torch version, and what `--dtype auto` picks here."""
    from kvstrata.model.cpu_caps import read_cpu_info
    from kvstrata.model.dtype_plan import bf16_fast_from_flags

    cpu = read_cpu_info()
    fast = bf16_fast_from_flags(cpu)
    return {**cpu.report(), "native_bf16": fast}


def machine_line() -> str:
    """One Markdown line: `machine: AMD EPYC (x86_64, 2 cores; flags avx2,fma; torch 2.13.0)`."""
    m = machine_info()
    flags = ",".join(m["cpu_flags"]) or "none"
    return f"machine: {m['cpu_model']} ({m['cpu_machine']}, {m['cpu_cores']} cores; flags {flags}; torch {m['torch_version']})"


def with_machine(report: dict[str, Any]) -> dict[str, Any]:
    """`report` with a "machine" entry (an existing one is kept)."""
    report.setdefault("machine", machine_info())
    return report
