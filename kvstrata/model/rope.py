"""Rotary position tables, computed once in float32 as transformers does (rotate_half layout).

Scaling (`rope_scaling` / `rope_parameters` in a HF config, `{arch}.rope.scaling.*` in a GGUF): `linear`,
`llama3` (Llama 3.1/3.2) and `yarn` (Qwen2.5/Qwen3 past their native context, DeepSeek): YaRN keeps the
high-frequency dimensions as trained, interpolates the low ones by `factor` with a linear ramp between
(beta_fast, beta_slow rotations over the original context), and scales cos and sin by its attention
factor (0.1 ln(factor) + 1 unless the config names one, or mscale / mscale_all_dim).
"""
from __future__ import annotations

import math
from typing import Any

import torch

from kvstrata.model.arch import ModelArch


def _llama3_scale(inv_freq: torch.Tensor, cfg: dict[str, float]) -> torch.Tensor:
    factor = cfg["factor"]
    low, high = cfg.get("low_freq_factor", 1.0), cfg.get("high_freq_factor", 4.0)
    old_len = cfg.get("original_max_position_embeddings", 8192)
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(inv_freq: torch.Tensor, cfg: dict[str, Any], arch: ModelArch) -> tuple[torch.Tensor, float]:
    """(inverse frequencies, attention factor) of YaRN, as transformers computes them."""
    dim, base = arch.head_dim, arch.rope_theta
    original = cfg.get("original_max_position_embeddings") or arch.max_position
    factor = cfg.get("factor") or arch.max_position / original
    attention = cfg.get("attention_factor")
    if attention is None:
        mscale, all_dim = cfg.get("mscale"), cfg.get("mscale_all_dim")
        attention = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, all_dim) if mscale and all_dim \
            else _yarn_mscale(factor)
    fast, slow = cfg.get("beta_fast") or 32, cfg.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(fast), correction_dim(slow)
    if cfg.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / ((high - low) or 0.001), 0, 1)
    extrapolate = 1 - ramp  # 1: the dimension keeps its trained frequency
    return inv_freq / factor * (1 - extrapolate) + inv_freq * extrapolate, float(attention)


def _scaled(arch: ModelArch) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [D/2], the factor cos and sin are scaled by)."""
    dim = arch.head_dim
    inv_freq = 1.0 / (arch.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = dict(arch.rope_scaling or ())
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv_freq, 1.0
    if kind == "linear":
        return inv_freq / float(scaling["factor"]), 1.0
    if kind == "llama3":
        return _llama3_scale(inv_freq, scaling), 1.0
    if kind == "yarn":
        return _yarn(inv_freq, scaling, arch)
    raise ValueError(f"rope scaling {kind!r} is not supported (supported: default, linear, llama3, yarn)")


def inverse_frequencies(arch: ModelArch) -> torch.Tensor:
    return _scaled(arch)[0]


def rope_tables(arch: ModelArch, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin: [max_position, head_dim] float32."""
    inv_freq, attention = _scaled(arch)  # [D/2]
    pos = torch.arange(arch.max_position, dtype=torch.float32)
    freqs = pos[:, None] * inv_freq[None, :]  # [P, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [P, D]
    if attention == 1.0:
        return emb.cos().to(device), emb.sin().to(device)
    return (emb.cos() * attention).to(device), (emb.sin() * attention).to(device)
