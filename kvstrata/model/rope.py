"""Rotary position tables, computed once in float32 as transformers does (rotate_half layout)."""
from __future__ import annotations

import math

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


def inverse_frequencies(arch: ModelArch) -> torch.Tensor:
    dim = arch.head_dim
    inv_freq = 1.0 / (arch.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = dict(arch.rope_scaling or ())
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / float(scaling["factor"])
    if kind == "llama3":
        return _llama3_scale(inv_freq, scaling)
    raise ValueError(f"rope scaling {kind!r} is not supported (supported: default, linear, llama3)")


def rope_tables(arch: ModelArch, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin: [max_position, head_dim] float32."""
    inv_freq = inverse_frequencies(arch)  # [D/2]
    pos = torch.arange(arch.max_position, dtype=torch.float32)
    freqs = pos[:, None] * inv_freq[None, :]  # [P, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [P, D]
    return emb.cos().to(device), emb.sin().to(device)
