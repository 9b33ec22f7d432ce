"""Our C++ CPU kernels (kvstrata/model/csrc/), built on first use and cached under $KVSTRATA_HOME.

`load_kernels()` compiles csrc/*.cpp with g++ (-O3 -march=native -fopenmp, through
torch.utils.cpp_extension, so it links against this torch) into one library in
$KVSTRATA_HOME/torch_extensions/<name>, named by a hash of the sources, the torch version and the
CPU's model and flags: a restart loads the built library in milliseconds, and a different CPU or
torch builds its own. The ops land in torch.ops.kvstrata: paged_decode (decode attention over the
page pool), paged_prefill (causal prefill attention over the pages in bf16, on AVX512-BF16 dot
products where the CPU has them), rms_norm, add_rms_norm, rope_store, silu_mul and int8_head_logits (the
int8 LM head on VNNI or AVX2 integer dot products, model/quant/int8_head.py), int_dot_linear and
int_dot_dequant (a GGUF's quantized linears on the same, from their own blocks, model/quant/int_dot.py),
gguf_rows (rows of a GGUF matrix read and dequantized, model/quant/gguf_rows.py),
and decode_layers (all layers of a pure decode step on those ops in one call, model/decode_layers.py). KVSTRATA_CPU_ISA=avx2 builds for the x86-64-v3
level instead of -march=native (cpu_caps.py). A machine without a compiler gets False and a logged
reason; callers keep the torch path.
"""
from __future__ import annotations

import fcntl
import functools
import hashlib
import logging
import os
import shutil
import threading
import time
from pathlib import Path

import torch

from kvstrata.model.cpu_caps import isa_cap, read_cpu_info
from kvstrata.model.fetch import model_home

log = logging.getLogger(__name__)

CSRC = Path(__file__).parent / "csrc"
SOURCES = (CSRC / "paged_decode.cpp", CSRC / "paged_prefill.cpp", CSRC / "rms_norm.cpp",
           CSRC / "rope_store.cpp", CSRC / "silu_mul.cpp", CSRC / "int8_head.cpp",
           CSRC / "int_dot_linear.cpp", CSRC / "int_dot_dequant.cpp",
           CSRC / "decode_layers.cpp", CSRC / "gguf_rows.cpp")  # paged_decode.cpp defines the op library
HEADERS = (CSRC / "exp_approx.h", CSRC / "paged_prefill_portable.h", CSRC / "paged_prefill_avx512.h",
           CSRC / "int_dot_common.h", CSRC / "int_dot_amx.h", CSRC / "amx_tiles.h", CSRC / "paged_decode_amx.h",
           CSRC / "paged_decode_amx_chunk.h",
           CSRC / "paged_decode_fma.h", CSRC / "int_dot_avx2.h", CSRC / "int_dot_avx2_common.h",
           CSRC / "int_dot_avx2_q4.h", CSRC / "int_dot_avx2_hb.h",
           CSRC / "int_dot_q8_bytes.h")  # included by the sources: in the build tag too
CFLAGS = ["-O3", "-fopenmp", "-ffp-contract=fast"]
MARCH = {"native": ["-march=native"], "avx2": ["-march=x86-64-v3", "-mtune=native"],
         "portable": ["-march=x86-64", "-mtune=native"]}  # by cpu_caps.isa_cap()
_lock = threading.Lock()
_loaded: dict[str, bool] = {}


def cflags() -> list[str]:
    """g++ flags: -march=native, or the x86-64-v3 level under KVSTRATA_CPU_ISA=avx2, or plain x86-64 under
    KVSTRATA_CPU_ISA=portable (cpu_caps.py)."""
    return [*CFLAGS, *MARCH[isa_cap()]]


def build_tag(sources: tuple[Path, ...] = SOURCES) -> str:
    cpu = read_cpu_info()
    raw = b"|".join([*(p.read_bytes() for p in (*sources, *HEADERS)), torch.__version__.encode(), cpu.model.encode(),
                     ",".join(sorted(cpu.flags)).encode(), " ".join(cflags()).encode()])
    return hashlib.sha256(raw).hexdigest()[:16]


def use_package_ninja() -> None:
    """Put the ninja of our `ninja` dependency first on PATH. Builds are incremental through ninja's log,
    which records a hash of each command, and ninja 1.12 changed that hash: where the system has another
    ninja (Debian's 1.11) and a start finds one or the other by how it was launched (the venv activated
    or not), every start rebuilt all the kernels (~80 s on 2 cores). Where the package is missing, the
    PATH's ninja stays."""
    try:
        import ninja
    except ImportError:
        return
    path = os.environ.get("PATH", "")
    if path.split(os.pathsep)[0] != ninja.BIN_DIR:
        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + path


def _build(name: str, directory: Path) -> None:
    from torch.utils import cpp_extension

    use_package_ninja()
    directory.mkdir(parents=True, exist_ok=True)
    # torch's own build lock is a plain file, left behind if a builder is killed, and then every later
    # start waits on it forever; an flock dies with its holder, so under ours a leftover is stale
    with open(directory / "kvstrata.flock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        (directory / "lock").unlink(missing_ok=True)
        cpp_extension.load(
            name=name,
            sources=[str(p) for p in SOURCES],
            extra_cflags=cflags(),
            extra_ldflags=["-fopenmp"],  # DT_NEEDED libgomp.so.1: the dynamic loader reuses torch's copy
            build_directory=str(directory),
            is_python_module=False,
            verbose=False,
        )


def load_kernels() -> bool:
    """True once the torch.ops.kvstrata ops are usable (building them if needed), False with a
    logged reason when they cannot be built here."""
    with _lock:
        if "kernels" in _loaded:
            return _loaded["kernels"]
        ok = False
        if shutil.which("g++") is None and shutil.which("c++") is None:
            log.warning("cpu_kernels: no C++ compiler; attention and norms stay on the torch path")
        else:
            tag = build_tag()
            name = f"kvstrata_cpu_kernels_{tag}"
            start = time.perf_counter()
            try:
                _build(name, model_home() / "torch_extensions" / name)
                ok = hasattr(torch.ops.kvstrata, "paged_decode")
                log.info("cpu_kernels: ready in %.1f s (%s)", time.perf_counter() - start, name)
            except Exception as exc:  # a failed build is a slower server, not a dead one
                lines = str(exc).strip().splitlines()
                why = next((ln for ln in lines if "error" in ln.lower() and ".cpp" in ln), lines[-1] if lines else "")
                log.warning("cpu_kernels: the build failed (%s); attention and norms stay on the torch path",
                            why or type(exc).__name__)
        _loaded["kernels"] = ok
        return ok


HEAD_DIMS = (16, 32, 64, 128, 256)  # the head sizes paged_decode.cpp and paged_prefill.cpp are instantiated for
MAX_GROUP = 16  # query heads per KV head it handles (kMaxGroup)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def paged_decode_supports(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether the kernel handles these shapes and dtypes (else the caller takes the torch path)."""
    return (q.device.type == "cpu" and q.shape[-1] in HEAD_DIMS and q.dtype in DTYPES and k_cache.dtype == q.dtype
            and q.shape[1] % k_cache.shape[1] == 0 and q.shape[1] // k_cache.shape[1] <= MAX_GROUP)


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pages: torch.Tensor,
                 lens: torch.Tensor, page_size: int) -> torch.Tensor:
    """q [B, H, D] (one token per row), caches [slots, Hkv, D], pages [B, P] int64, lens [B] int64
    -> [B, H, D]: softmax(q K^T / sqrt(D)) V over each row's first lens[b] tokens, read in place."""
    return torch.ops.kvstrata.paged_decode(q.contiguous(), k_cache, v_cache, pages, lens, page_size)


@functools.cache
def _cpu_flags() -> frozenset[str]:
    return read_cpu_info().flags


def native_bf16_dot() -> bool:
    """Whether this CPU has vdpbf16ps (AVX512-BF16), which paged_prefill.cpp is built on with -march=native."""
    return "avx512_bf16" in _cpu_flags()


def has_avx512() -> bool:
    return "avx512f" in _cpu_flags()


def silu_mul_simd() -> bool:
    """Whether silu_mul.cpp gets a vector loop here (AVX-512, or AVX2 with FMA; both give the same bits);
    its portable loop is not faster than torch's two ops."""
    flags = _cpu_flags()
    return "avx512f" in flags or all(f in flags for f in ("avx2", "fma"))


def amx_bf16_attention() -> bool:
    """Whether paged_decode scores a bf16 cache on AMX tiles here (paged_decode_amx.h): the CPU lists
    amx_bf16 and amx_tile (under the ISA cap). Its row groups then also serve bf16 prefill chunks."""
    flags = _cpu_flags()
    return "amx_bf16" in flags and "amx_tile" in flags


def int_dot_simd() -> bool:
    """Whether int8_head.cpp and int_dot_linear.cpp get a vector form here: vpdpbusd (AVX512-VNNI) or its
    AVX2 equivalent (vpmaddubsw + vpmaddwd, with FMA and F16C); both give the same bits."""
    flags = _cpu_flags()
    return "avx512_vnni" in flags or all(f in flags for f in ("avx2", "fma", "f16c"))


def int_dot_isa() -> str:
    """Which form of int_dot_linear (q4; on AMX q8 too) the built library runs: amx_int8 (calls of 4 rows or
    more; fewer on avx512_vnni), avx512_vnni, avx2 or portable (int8_head_logits: the same but for amx_int8,
    which it runs on VNNI)."""
    return str(torch.ops.kvstrata.int_dot_isa())


def paged_prefill_supports(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether the engine runs this prefill chunk with the kernel: bf16, a head size it is built for,
    on a CPU with AVX512-BF16 (where it was measured ~2x torch's flash kernel). Elsewhere the op
    still works (portable code, for its tests) but is not measured against torch, so SDPA stays."""
    return (q.device.type == "cpu" and q.dtype == torch.bfloat16 and k_cache.dtype == torch.bfloat16
            and q.shape[-1] in HEAD_DIMS and q.shape[1] % k_cache.shape[1] == 0 and native_bf16_dot())


def paged_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pages: torch.Tensor,
                  kv_len: int, page_size: int) -> torch.Tensor:
    """q [n, H, D]: the last n of a sequence's kv_len tokens, whose K/V are already in its pages [P]
    -> [n, H, D]: causal softmax(q K^T / sqrt(D)) V (query i sees tokens <= kv_len - n + i)."""
    return torch.ops.kvstrata.paged_prefill(q.contiguous(), k_cache, v_cache, pages.contiguous(), kv_len, page_size)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm of each row of x [rows, hidden] in one op (csrc/rms_norm.cpp)."""
    return torch.ops.kvstrata.rms_norm(x, weight, eps)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x += delta in place (the residual stream), then rms_norm(x), in one op."""
    return torch.ops.kvstrata.add_rms_norm(x, delta.contiguous(), weight, eps)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [T, 2I] (gate, then up) -> silu(gate) * up [T, I], in one op (csrc/silu_mul.cpp)."""
    return torch.ops.kvstrata.silu_mul(gate_up.contiguous())


def rope_store(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               slots: torch.Tensor, heads: int, kv_heads: int, q_norm: torch.Tensor | None = None,
               k_norm: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """qkv [T, (H + 2 Hkv) * D], cos/sin [T, D] -> q [T, H, D] with RoPE applied; k (rotated) and v
    written to the caches' rows `slots` [T], in one op (csrc/rope_store.cpp). With `q_norm` and `k_norm`
    ([D], Qwen3) each q and k head is RMS-normed by them (`eps`) first."""
    return torch.ops.kvstrata.rope_store(qkv.contiguous(), cos, sin, k_cache, v_cache, slots, heads, kv_heads,
                                         q_norm, k_norm, eps)
