"""The model an engine runs: the dtype plan, the weights in the plan's forms, the model built on them,
and the KV layout name that keeps pages of different numerics apart."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from kvstrata.config import ModelConfig
from kvstrata.config_flags import ConfigError
from kvstrata.engine.malloc_tuning import release_freed_heap
from kvstrata.model import cpu_kernels
from kvstrata.model.attention import AttentionBackend, attention_layout, make_attention_backend
from kvstrata.model.cpu_caps import read_cpu_info
from kvstrata.model.dtype_plan import plan_dtype
from kvstrata.model.fetch import model_home, resolve_model
from kvstrata.model.llama import LlamaModel
from kvstrata.model.quant.plan import (activation_bits, head_bits, prefill_mode, q4_decode_wanted, quant_backend, unmet_request,
                                       weights_plan_line)
from kvstrata.model.tokenizer import Tokenizer
from kvstrata.model.weights import load_weights

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# decode steps of up to this many rows (a batch, or a verify step's rows) stay on the quantized kernels, in
# every dtype: a request's verify steps then run on the kernels of its one-row steps, so drafts do not change
# its greedy tokens (the bf16 plan kept 8, so a wider verify step took the dense linears: other numerics than
# its one-row steps'). Up to 32 rows the quantized step is no slower than the dense GEMM in float32 or bf16
# (bench/verify_rows.py; figures in docs/cpu-kernels.md)
DECODE_MAX_ROWS = 32


@dataclass(frozen=True)
class LoadedModel:
    path: Path  # the resolved model file or folder
    model: LlamaModel
    tokenizer: Tokenizer
    identity: str  # the weights' identity (the KV namespace's)
    dtype_name: str
    dtype: torch.dtype
    device: torch.device
    attention: AttentionBackend


def load_model(model_cfg: ModelConfig) -> LoadedModel:
    """Plan, load and build the model; ConfigError where a flag asks for what this model or CPU cannot do."""
    path = resolve_model(model_cfg.model)
    cpu = read_cpu_info() if model_cfg.device.startswith("cpu") else None
    plan = plan_dtype(model_cfg.dtype, model_cfg.device, cpu=cpu)
    dtype = DTYPES[plan.dtype]
    device = torch.device(model_cfg.device)
    try:
        want_q4 = q4_decode_wanted(model_cfg.q4_decode, device, dtype, auto_on=plan.q4_auto)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    backend = quant_backend(want_q4 and path.is_file(), model_cfg.fused_ops == "auto")
    act_bits = activation_bits(model_cfg.activation_bits, path)
    prefill = prefill_mode(model_cfg.prefill_weights, backend, path, dtype, act_bits)
    cache_root = model_home() / "converted" if model_cfg.weights_cache == "auto" else None
    weights = load_weights(path, dtype if device.type == "cpu" else torch.float32, backend, prefill == "dense",
                           cache_root)
    tokenizer = Tokenizer.from_path(path)
    try:
        attention = make_attention_backend(model_cfg.attention_backend, device)
    except (ValueError, RuntimeError) as exc:
        raise ConfigError(f"--attention-backend {model_cfg.attention_backend}: {exc}") from None
    model = LlamaModel(weights.arch, weights.tensors, dtype, device, attention, tiles=weights.tiles, q4=weights.q4,
                       rows=weights.rows, decode_max_rows=DECODE_MAX_ROWS,
                       fused_ops=model_cfg.fused_ops == "auto",
                       fused_decode_layers=model_cfg.fused_decode_layers == "auto",
                       act_bits=act_bits, int_prefill=prefill == "int",
                       head_bits=head_bits(model_cfg.head_bits, act_bits))
    why = unmet_request(model_cfg.activation_bits, model_cfg.prefill_weights, model.uses_int_dot,
                        model_cfg.head_bits)
    if why:
        raise ConfigError(why)
    if model_cfg.q4_decode == "on" and not model.uses_quant:
        raise ConfigError(f"--q4-decode on: {path.name} has no quantized linears our kernels run (Q4_0/1, Q5_0/1, "
                          "Q8_0, Q4_K, Q5_K, Q6_K); use such a GGUF or --q4-decode off")
    log.info("%s", plan.log_line(cpu, model.uses_quant))
    log.info("%s", weights_plan_line(model, weights.types))
    identity = weights.identity
    del weights  # the model holds what it runs on
    if model_cfg.malloc_tuning == "auto" and device.type == "cpu":
        release_freed_heap()
    log.info("attention backend: %s; fused norms: %s; quantized/int8 kernels: %s; decode layers in one op: %s",
             type(attention).__name__, model.fused_ops,
             cpu_kernels.int_dot_isa() if model.uses_int_dot else "torch", model.decode_layers is not None)
    return LoadedModel(path, model, tokenizer, identity, plan.dtype, dtype, device, attention)


def kv_layout(loaded: LoadedModel) -> str:
    """The KV namespace's layout part. K/V differ (slightly) between the int4 and dense decode paths (torch's
    kernel or ours), the fused ops round differently from torch's, and the C++ attention kernels sum in
    another order: separate namespaces, so no tier (L3 is shared across machines of any CPU) mixes them."""
    m = loaded.model
    return ("llama-paged-v1" + ("+q4decode" if m.uses_quant else "") + ("+intdot" if m.uses_int_dot else "")
            + ("" if m.dense_linears else "+intprefill" if m.int_prefill else "+dequantprefill")
            + ("+act8" if m.act_bits == 8 else "")
            + ("+fusedops" if m.fused_ops else "") + ("+silumul" if m.fused_silu else "")
            + attention_layout(loaded.attention, loaded.dtype, loaded.device))
