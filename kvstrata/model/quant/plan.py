"""Which quantized path a model runs, decided once at start (`--q4-decode`, `--prefill-weights`).

- backend: "int_dot" (our integer-dot kernels: every block type of quant/blocks.py, where the C++
  kernels build and the CPU has AVX512-VNNI or AVX2, with `--fused-ops auto`), "torch_int4" (torch's
  CPU int4 kernel: Q4_0/Q4_1 only, dense copies beside), or None (dense only: the exact float32 path,
  `--q4-decode off`, CUDA).
- keep_dense: whether wide (prefill) steps get dense copies of the quantized linears. A dense copy is
  2-4 bytes a weight (5-8x the file of a 4-bit model), so `auto` keeps one only for small models
  (<= DENSE_AUTO_BYTES); larger ones dequantize each linear just before its GEMM.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import torch

DENSE_AUTO_BYTES = 1 << 30


def q4_decode_supported(device: torch.device, dtype: torch.dtype) -> str | None:
    """None if a quantized decode path can run here, else why not."""
    if device.type != "cpu":
        return f"device {device} (the quantized kernels are CPU-only)"
    if dtype not in (torch.bfloat16, torch.float32):
        return f"dtype {dtype} (the CPU kernels take bfloat16 or float32 activations)"
    return None


def q4_decode_wanted(mode: str, device: torch.device, dtype: torch.dtype, auto_on: bool | None = None) -> bool:
    """`--q4-decode`: auto = `auto_on` where a kernel runs (dtype_plan.py's choice; by default CPU
    bfloat16 only, so an explicit float32 stays transformers-identical); on = wherever one runs
    (ValueError where none can); off = never."""
    why_not = q4_decode_supported(device, dtype)
    if mode == "on" and why_not:
        raise ValueError(f"--q4-decode on is not possible here: {why_not}; use --q4-decode off")
    if auto_on is None:
        auto_on = dtype == torch.bfloat16
    return mode == "on" or (mode == "auto" and why_not is None and auto_on)


def quant_backend(wanted: bool, fused_ops: bool) -> str | None:
    if not wanted:
        return None
    from kvstrata.model import cpu_kernels

    if fused_ops and cpu_kernels.load_kernels() and cpu_kernels.int_dot_simd():
        return "int_dot"
    from kvstrata.model.quant.torch_int4 import torch_int4_supported

    return "torch_int4" if torch_int4_supported() else None


def keep_dense(mode: str, backend: str | None, path: Path, dtype: torch.dtype) -> bool:
    """`--prefill-weights`: dense = always keep dense copies; dequant = never (int_dot only); auto = by size."""
    if backend != "int_dot" or mode == "dense":
        return True
    if mode == "dequant":
        return False
    return dense_bytes(path, dtype) <= DENSE_AUTO_BYTES


def dense_bytes(path: Path, dtype: torch.dtype) -> int:
    """The bytes dense copies of a model's weights would take in `dtype` (0 for a folder: always dense)."""
    if path.is_dir():
        return 0
    from kvstrata.model.gguf_header import read_gguf_header

    size = torch.tensor([], dtype=dtype).element_size()
    total = 0
    for info in read_gguf_header(path).tensors:
        n = 1
        for d in info.shape:
            n *= int(d)
        total += n * size
    return total


def weights_plan_line(model: Any, types: dict[str, str]) -> str:
    """One key=value start-up line: which kernel runs which linears, the file's types, resident bytes.
    `model` is a LlamaModel (typed loosely: this module sits below it)."""
    kernels: Counter[str] = Counter()
    for layer in model.layers:
        for lin in layer.linears():
            kernels["+".join(lin.quant.formats()) if lin.quant is not None else "dense"] += 1
    resident = model.resident_bytes()
    fields = [f"quantized={'int_dot' if model.uses_int_dot else 'torch_int4' if model.uses_quant else 'none'}",
              f"prefill_weights={'dense' if model.dense_linears else 'dequant'}",
              "linears=" + ",".join(f"{k}:{v}" for k, v in sorted(kernels.items())),
              "file_types=" + ",".join(f"{k}:{v}" for k, v in sorted(Counter(types.values()).items())),
              *(f"{k}_mb={v / 2**20:.0f}" for k, v in resident.items()),
              f"embedding={'dense' if model.embedding.dense is not None else 'file_rows'}"]
    return "weights_plan " + " ".join(fields)
