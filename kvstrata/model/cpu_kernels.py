"""Our C++ CPU kernels (kvstrata/model/csrc/), built on first use and cached under $KVSTRATA_HOME.

`load_paged_decode()` compiles csrc/paged_decode.cpp with g++ (-O3 -march=native -fopenmp, through
torch.utils.cpp_extension, so it links against this torch) into
$KVSTRATA_HOME/torch_extensions/<tag>, where the tag is a hash of the source, the torch version and
the CPU's model and flags: a restart loads the built library in milliseconds, and a different CPU
or torch builds its own. The op lands in torch.ops.kvstrata.paged_decode. A machine without a
compiler gets None and a logged reason; callers fall back to the torch path.
"""
from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import threading
import time
from pathlib import Path

import torch

from kvstrata.model.cpu_caps import read_cpu_info
from kvstrata.model.fetch import model_home

log = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "paged_decode.cpp"
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=fast"]
_lock = threading.Lock()
_loaded: dict[str, bool] = {}


def build_tag(source: Path = SOURCE) -> str:
    cpu = read_cpu_info()
    raw = b"|".join([source.read_bytes(), torch.__version__.encode(), cpu.model.encode(),
                     ",".join(sorted(cpu.flags)).encode(), " ".join(CFLAGS).encode()])
    return hashlib.sha256(raw).hexdigest()[:16]


def _build(name: str, directory: Path) -> None:
    from torch.utils import cpp_extension

    if shutil.which("ninja") is None:  # the pip wheel's binary, when the venv's bin is not on PATH
        import ninja

        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
    directory.mkdir(parents=True, exist_ok=True)
    # torch's own build lock is a plain file, left behind if a builder is killed, and then every later
    # start waits on it forever; an flock dies with its holder, so under ours a leftover is stale
    with open(directory / "kvstrata.flock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        (directory / "lock").unlink(missing_ok=True)
        cpp_extension.load(
            name=name,
            sources=[str(SOURCE)],
            extra_cflags=CFLAGS,
            extra_ldflags=["-fopenmp"],  # DT_NEEDED libgomp.so.1: the dynamic loader reuses torch's copy
            build_directory=str(directory),
            is_python_module=False,
            verbose=False,
        )


def load_paged_decode() -> bool:
    """True once torch.ops.kvstrata.paged_decode is usable (building it if needed), False with a
    logged reason when it cannot be built here."""
    with _lock:
        if "paged_decode" in _loaded:
            return _loaded["paged_decode"]
        ok = False
        if shutil.which("g++") is None and shutil.which("c++") is None:
            log.warning("cpu_kernels: no C++ compiler; decode attention stays on the torch path")
        else:
            tag = build_tag()
            name = f"kvstrata_paged_decode_{tag}"
            start = time.perf_counter()
            try:
                _build(name, model_home() / "torch_extensions" / name)
                ok = hasattr(torch.ops.kvstrata, "paged_decode")
                log.info("cpu_kernels: paged_decode ready in %.1f s (%s)", time.perf_counter() - start, name)
            except Exception as exc:  # a failed build is a slower server, not a dead one
                log.warning("cpu_kernels: building paged_decode failed (%s); decode attention stays on the torch path",
                            str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__)
        _loaded["paged_decode"] = ok
        return ok


HEAD_DIMS = (16, 32, 64, 128, 256)  # the head sizes paged_decode.cpp is instantiated for
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
