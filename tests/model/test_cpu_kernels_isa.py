"""The ISA forms of the integer-dot kernels (csrc/int_dot_linear.cpp, csrc/int8_head.cpp): the library
built here runs the vector form its CPU flags call for, and a build capped at AVX2
(KVSTRATA_CPU_ISA=avx2, -march=x86-64-v3; built and run in a fresh process, since one process
registers the ops once) gives the same bits as this machine's own build for both ops."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kvstrata.model import cpu_kernels
from kvstrata.model.cpu_caps import parse_cpuinfo
from kvstrata.model.quant import int_dot
from kvstrata.model.quant.blocks import IntWeight, KScales
from kvstrata.model.quant.int8_head import Int8HeadPack

REAL_FLAGS = parse_cpuinfo(Path("/proc/cpuinfo").read_text())[1]
CAPPED = """import sys, torch
from kvstrata.model import cpu_kernels
from test_cpu_kernels_isa import outputs
assert cpu_kernels.load_kernels()
assert '-march=x86-64-v3' in cpu_kernels.cflags(), cpu_kernels.cflags()
assert not cpu_kernels.native_bf16_dot() and not cpu_kernels.has_avx512()
print(cpu_kernels.int_dot_isa())
torch.save(outputs(), sys.argv[1])
"""


def outputs() -> dict[str, torch.Tensor]:
    """Both ops on seeded inputs: every row count of a pass (1..8, and past it), both tails of the
    AVX2 four-row passes, a whole AMX pass of 16 rows and one past it, float32 and bf16 activations, every packed format, the model's own packers."""
    g = torch.Generator().manual_seed(0)
    out = {}
    for bits, (n, k) in ((4, (48, 96)), (4, (3072, 576)), (4, (576, 1536)), (5, (64, 256)), (6, (64, 256)), (8, (64, 256))):
        group = 16 if bits == 6 else 32
        q = torch.randint(0, 2**bits, (n, k), generator=g, dtype=torch.uint8)
        scale, bias = torch.rand(n, k // group, generator=g) * 0.02, torch.randn(n, k // group, generator=g) * 0.05
        zero = 1 << (bits - 1)
        for name, w in ((f"q{bits}", IntWeight(q, scale, bias, bits, group)),
                        (f"q{bits}s", IntWeight(q, scale, -zero * scale, bits, group, zero))):
            packed = int_dot.pack(w)
            for rows in (1, 3, 4, 5, 8, 11, 16, 19):
                x = torch.randn(rows, k, generator=g) * 3
                for dtype in (torch.float32, torch.bfloat16):
                    out[f"{name} {n}x{k} rows={rows} {dtype}"] = int_dot.linear(x.to(dtype), [packed])
                    out[f"{name} {n}x{k} rows={rows} {dtype} 8-bit"] = int_dot.linear(x.to(dtype), [packed], 8)
    for n, k in ((48, 256), (2048, 2048)):  # Q4_K as q4k: 8-bit sc and m a tile row, float16 d and -dmin a super-tile
        q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
        d, dmin = ((torch.rand(n, k // 256, generator=g) * 2e-3).half().float() for _ in range(2))
        sc, m = (torch.randint(0, 64, (n, k // 32), generator=g, dtype=torch.uint8) for _ in range(2))
        scale, bias = d.repeat_interleave(8, 1) * sc.float(), -dmin.repeat_interleave(8, 1) * m.float()
        packed = int_dot.pack(IntWeight(q, scale, bias, 4, 32, 0, KScales(d, dmin, sc, m)))
        for rows in (1, 3, 4, 5, 8, 11, 16, 19):
            x = torch.randn(rows, k, generator=g) * 3
            out[f"q4k {n}x{k} rows={rows}"] = int_dot.linear(x, [packed])
            out[f"q4k {n}x{k} rows={rows} 8-bit"] = int_dot.linear(x.bfloat16(), [packed], 8)
    for v, k in ((48, 64), (4096, 576)):
        w = torch.randint(-127, 128, (v, k), generator=g, dtype=torch.int8)
        pack = Int8HeadPack.of(w, torch.rand(v, generator=g) * 0.01)
        for rows in (1, 4, 6, 8, 9, 16, 19):
            x = torch.randn(rows, k, generator=g)
            out[f"head {v}x{k} rows={rows}"] = torch.ops.kvstrata.int8_head_logits(x, pack.packed, pack.wsum, pack.wscale)
    return out


@pytest.fixture(scope="module", autouse=True)
def built() -> None:
    assert cpu_kernels.load_kernels(), "the C++ kernels did not build (see the log)"


def test_the_build_runs_the_vector_form_the_flags_call_for() -> None:
    want = ("amx_int8" if {"amx_tile", "amx_int8"} <= REAL_FLAGS
            else "avx512_vnni" if "avx512_vnni" in REAL_FLAGS
            else "avx2" if {"avx2", "fma", "f16c"} <= REAL_FLAGS else "portable")
    assert cpu_kernels.int_dot_isa() == want
    assert cpu_kernels.int_dot_simd() == (want != "portable")


@pytest.mark.skipif(not {"avx2", "fma", "f16c"} <= REAL_FLAGS, reason="the AVX2-capped build (-march=x86-64-v3) "
                    "runs only on an x86-64 CPU with AVX2, FMA and F16C")
def test_an_avx2_build_gives_the_same_bits_as_this_one(tmp_path: Path) -> None:
    assert {"avx2", "fma", "f16c"} <= REAL_FLAGS, "CI machines are x86-64-v3 at least"
    script = tmp_path / "capped.py"
    script.write_text(CAPPED)
    path = os.pathsep.join([str(Path(__file__).parent), *sys.path])
    env = {**os.environ, "KVSTRATA_CPU_ISA": "avx2", "PYTHONPATH": path}
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "avx2.pt")], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["avx2"]  # the AVX2 loops, not the portable ones
    capped = torch.load(tmp_path / "avx2.pt")
    native = outputs()
    assert capped.keys() == native.keys() and len(native) == 430
    differ = [name for name in native if not torch.equal(native[name], capped[name])]
    assert not differ, differ
