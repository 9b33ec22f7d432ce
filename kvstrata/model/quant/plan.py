"""Which quantized path a model runs, decided once at start (`--q4-decode`, `--prefill-weights`).

- backend: "int_dot" (our integer-dot kernels: every block type of quant/blocks.py, where the C++
  kernels build and the CPU has AVX512-VNNI or AVX2, with `--fused-ops auto`), "torch_int4" (torch's
  CPU int4 kernel: Q4_0/Q4_1 only, dense copies beside), or None (dense only: the exact float32 path,
  `--q4-decode off`, CUDA).
- prefill_mode: whether wide (prefill) steps get dense copies of the quantized linears, dequantize each
  linear just before its GEMM, or run on the integer-dot kernels. A dense copy is 2-4 bytes a weight
  (5-8x the file of a 4-bit model), so `auto` keeps one only for small models (<= DENSE_AUTO_BYTES);
  with 8-bit activations the integer kernels are the fastest of the three.
- activation_bits: 8 or 16-bit integer activations for those kernels (`--activation-bits`).
- head_bits: the quantized LM head in 8 bits, or its candidate pass in 4 (`--head-bits`, q4_head.py).
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import torch

# every model narrower than WIDE_HIDDEN fits (Qwen3-0.6B: 1.2 GB in bf16, 2.4 GB in float32), so auto gives
# them dense copies: a wide step then skips dequantizing every linear, a fixed cost that an agent's next
# turn of a few dozen new tokens paid whole (docs/cpu-kernels.md has the figures)
DENSE_AUTO_BYTES = 3 << 30


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


def prefill_mode(mode: str, backend: str | None, path: Path, dtype: torch.dtype, act_bits: int) -> str:
    """`--prefill-weights` resolved: dense (keep dense copies), dequant (each linear dequantized just before
    its GEMM) or int (our integer-dot kernels, int_dot only). auto = int with 8-bit activations (there
    about 1.3-1.6x dequant + a float32 GEMM at 2,048 rows on AVX2, and no dense bytes), else dense up to
    DENSE_AUTO_BYTES of dense weights, else dequant. Without the int_dot backend: dense."""
    if backend != "int_dot":
        return "dense"
    if mode != "auto":
        return mode
    if act_bits == 8:
        return "int"
    return "dense" if dense_bytes(path, dtype) <= DENSE_AUTO_BYTES else "dequant"


def unmet_request(activation_bits_flag: str, prefill_weights_flag: str, uses_int_dot: bool,
                  head_bits_flag: str = "auto") -> str | None:
    """Why an explicit `--activation-bits 8`, `--prefill-weights int` or `--head-bits 4` cannot be honoured
    (they need the integer-dot kernels), else None."""
    if uses_int_dot:
        return None
    for flag, value, needs in (("--activation-bits", activation_bits_flag, "8"), ("--prefill-weights", prefill_weights_flag, "int"),
                               ("--head-bits", head_bits_flag, "4")):
        if value == needs:
            return (f"{flag} {value} needs our integer-dot kernels: a GGUF with quantized linears, a CPU with "
                    "AVX2 or AVX512-VNNI, --q4-decode auto/on (not an explicit --dtype float32) and --fused-ops auto")
    return None


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


WIDE_HIDDEN = 2048  # auto takes 8-bit activations from this hidden size up


def activation_bits(mode: str, path: Path) -> int:
    """`--activation-bits` resolved for a model: auto = 8 for a GGUF of hidden size >= WIDE_HIDDEN (the 1B-8B
    files people download for llama.cpp, whose numerics there are 8-bit activations: half the integer work,
    which decode steps of several rows and prefill on the integer kernels are bound by), else 16 (narrow
    models such as SmolLM2: greedy output as float32's on the dequantized weights)."""
    if mode != "auto":
        return int(mode)
    if path.is_dir():
        return 16
    from kvstrata.model.gguf_header import read_gguf_header

    embed = next((t for t in read_gguf_header(path).tensors if t.name == "token_embd.weight"), None)
    return 8 if embed is not None and embed.shape[-1] >= WIDE_HIDDEN else 16


def head_bits(mode: str, act_bits: int) -> int:
    """`--head-bits` resolved: auto = 4 where the linears take 8-bit activations (the GGUFs 2048 or more wide,
    whose batch-1 step reads the head after the linears: 13% of a 1B Q4_K_M step in int8), else 8."""
    if mode != "auto":
        return int(mode)
    return 4 if act_bits == 8 else 8


def weights_plan_line(model: Any, types: dict[str, str]) -> str:
    """One key=value start-up line: which kernel runs which linears, the file's types, resident bytes.
    `model` is a LlamaModel (typed loosely: this module sits below it)."""
    kernels: Counter[str] = Counter()
    for layer in model.layers:
        for lin in layer.linears():
            kernels["+".join(lin.quant.formats()) if lin.quant is not None else "dense"] += 1
    resident = model.resident_bytes()
    fields = [f"quantized={'int_dot' if model.uses_int_dot else 'torch_int4' if model.uses_quant else 'none'}",
              f"prefill_weights={'dense' if model.dense_linears else 'int' if model.int_prefill else 'dequant'}",
              f"activation_bits={model.act_bits}",
              f"head_bits={model.head.bits or 'dense'}",
              "linears=" + ",".join(f"{k}:{v}" for k, v in sorted(kernels.items())),
              "file_types=" + ",".join(f"{k}:{v}" for k, v in sorted(Counter(types.values()).items())),
              *(f"{k}_mb={v / 2**20:.0f}" for k, v in resident.items()),
              f"embedding={'dense' if model.embedding.dense is not None else 'file_rows'}"]
    return "weights_plan " + " ".join(fields)
