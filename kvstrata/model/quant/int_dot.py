"""Quantized weights in the layout of our integer-dot kernels (csrc/int_dot_common.h), and their ops.

`pack(w)` turns an `IntWeight` (blocks.py) into uint8 [N / 16, K / 32, tile bytes]: per tile of 16 output
rows x 32 inputs, the low nibbles of q, its high bits (q5, q6, q8), then float16 scales and biases (none
for a symmetric type, whose bias is -zero * scale: the "s" formats). It packs in chunks of rows, so the
only full-size tensor it makes is the result. Tile bytes per 512 weights: q4 320 (5.0 bits a weight;
Q4_1 5.0), q5 384 (6.0; Q5_K 5.5), q4s 288 (4.5; Q4_0 4.5), q5s 352 (5.5; Q5_0 5.5), q6s 448
(7.0; Q6_K 6.56), q8s 544 (8.5; Q8_0 8.5); q6 512 and q8 576 for asymmetric 6- and 8-bit values. Q4_K
packs as q4k, 296 on average (4.625; Q4_K 4.5): a tile's 16 rows keep their 6-bit sc and m as bytes, and
each run of 8 tiles (a super-block) its rows' float16 d and -dmin (csrc/int_dot_common.h).
Scales and biases the GGUF stores as float16 (d, m) are exact, and so are q4k's products; Q5_K's d * sc
takes one float16 rounding (relative 2^-11, far below the 5-bit step).
`linear(x, parts)` runs several packed weights (a fused q/k/v or gate/up, each part of its own type) on x;
`dequantize(packed, rows, out)` writes rows of one as dense values.
"""
from __future__ import annotations

import torch

import numpy as np

from kvstrata.model.quant.blocks import BLOCK_TYPES, SYMMETRIC, IntWeight, decode_blocks

LANES, GROUP = 16, 32  # output rows and inputs per tile
# bits of q -> (format name, high bits kept beside the low nibble, scale groups per tile row, tile bytes)
FORMATS: dict[int, tuple[str, int, int, int]] = {4: ("q4", 0, 1, 320), 5: ("q5", 1, 1, 384),
                                                 6: ("q6", 2, 2, 512), 8: ("q8", 4, 1, 576)}
SCALE_BYTES = 2 * LANES  # float16 scales of a tile row group (and as many biases, where kept)
SUPER_TILES, Q4K_TILE = 8, 256 + 2 * LANES  # q4k: tiles a super-tile (256 inputs); a tile: low plane, sc, m
Q4K_SUPER = SUPER_TILES * Q4K_TILE + 2 * SCALE_BYTES  # + d and -dmin, float16: 2,368 bytes
Q4K_BYTES = Q4K_SUPER // SUPER_TILES  # 296: the packed tensor's last size
PACK_ROWS = 2048  # rows packed at a time: bounds the temporaries of a large tensor (an 8B model's embedding)


def packable(w: IntWeight) -> str | None:
    """None if `w` fits the kernels' tiles, else why not."""
    return _packable(w.bits, w.group, *w.q.shape)


def _packable(bits: int, group: int, n: int, k: int) -> str | None:
    if bits not in FORMATS or group != (16 if bits == 6 else 32):
        return f"{bits}-bit values in groups of {group}"
    if n % LANES or k % GROUP:
        return f"shape [{n}, {k}] (rows must be a multiple of {LANES}, columns of {GROUP})"
    return None


def tile_bytes(bits: int, symmetric: bool = False) -> int:
    _, _, groups, size = FORMATS[bits]
    return size - SCALE_BYTES * groups if symmetric else size


def format_name(packed: torch.Tensor) -> str:
    if packed.shape[2] == Q4K_BYTES:
        return "q4k"
    for bits, (name, _, _, _) in FORMATS.items():
        for symmetric in (False, True):
            if tile_bytes(bits, symmetric) == packed.shape[2]:
                return name + "s" * symmetric
    raise ValueError(f"tile bytes {packed.shape[2]}: not a packed format")


def raw_packable(type_name: str, shape: tuple[int, ...]) -> bool:
    """Whether a GGUF tensor of this block type and shape [N, K] packs (without decoding it); stacked
    experts [E, N, K] pack where each expert's [N, K] does (its rows whole tiles: a view an expert)."""
    spec = BLOCK_TYPES.get(type_name)
    if spec is None or len(shape) not in (2, 3):
        return False
    per, _, bits, group = spec
    return shape[-1] % per == 0 and _packable(bits, group, shape[-2], shape[-1]) is None


def pack_raw(raw: np.ndarray, type_name: str, shape: tuple[int, int]) -> torch.Tensor:
    """A GGUF tensor's raw blocks [N, bytes a row] -> tiles, decoded and packed PACK_ROWS rows at a time
    (so a large tensor never exists unpacked); raises ValueError as `pack` does."""
    n, k = shape
    bits = BLOCK_TYPES[type_name][2]
    size = Q4K_BYTES if type_name == "Q4_K" else tile_bytes(bits, type_name in SYMMETRIC)
    out = torch.empty(n // LANES, k // GROUP, size, dtype=torch.uint8)
    for r in range(0, n, PACK_ROWS):
        w = decode_blocks(raw[r:r + PACK_ROWS], type_name, shape)
        out[r // LANES:(r + w.q.shape[0]) // LANES] = pack(w)
    return out


def pack(w: IntWeight) -> torch.Tensor:
    """w -> uint8 [N / 16, K / 32, tile bytes] (raises ValueError where `packable` says no, or where a
    scale or bias overflows float16); a symmetric `w` (w.zero) packs without its biases."""
    why = packable(w)
    if why:
        raise ValueError(f"cannot pack {why}")
    if w.zero and w.zero != 1 << (w.bits - 1):
        raise ValueError(f"cannot pack a symmetric {w.bits}-bit weight of zero {w.zero} "
                         f"(the kernels take {1 << (w.bits - 1)})")
    n, k = w.q.shape
    ks = w.kscales
    out = torch.empty(n // LANES, k // GROUP, Q4K_BYTES if ks is not None else tile_bytes(w.bits, w.zero > 0),
                      dtype=torch.uint8)
    for r in range(0, n, PACK_ROWS):
        rows = slice(r, min(n, r + PACK_ROWS))
        if ks is not None:
            packed = _pack_q4k_rows(w.q[rows], ks.d[rows], ks.dmin[rows], ks.sc[rows], ks.m[rows])
        else:
            packed = _pack_rows(w.q[rows], w.scale[rows], None if w.zero else w.bias[rows], w.bits)
        out[r // LANES:rows.stop // LANES] = packed
    return out


def _pack_q4k_rows(q: torch.Tensor, d: torch.Tensor, dmin: torch.Tensor, sc: torch.Tensor,
                   m: torch.Tensor) -> torch.Tensor:
    """Q4_K rows -> q4k super-tiles: per 8 tiles (low plane, 16 sc bytes, 16 m bytes), then 16 float16 d
    and 16 float16 -dmin; viewed as [n / 16, k / 32, 296]."""
    n, k = q.shape
    rb, kb = n // LANES, k // GROUP
    if k % (GROUP * SUPER_TILES):
        raise ValueError(f"cannot pack Q4_K of {k} inputs as q4k (a multiple of 256)")
    per_row = lambda t: t.view(rb, LANES, -1).permute(0, 2, 1)  # noqa: E731  [n, c] -> [rb, c, 16]
    low = _plane(_tile_view(q) & 0x0F).reshape(rb, kb, 256)
    tiles = torch.cat([low, per_row(sc.to(torch.uint8)), per_row(m.to(torch.uint8))], dim=-1)
    halves = torch.cat([per_row(d), per_row(-dmin)], dim=-1).to(torch.float16)  # [rb, k / 256, 32]
    if not torch.isfinite(halves).all():
        raise ValueError("cannot pack: a scale or bias overflows float16")
    supers = torch.cat([tiles.reshape(rb, kb // SUPER_TILES, SUPER_TILES * Q4K_TILE),
                        halves.contiguous().view(torch.uint8).reshape(rb, kb // SUPER_TILES, 2 * SCALE_BYTES)], dim=-1)
    return supers.reshape(rb, kb, Q4K_BYTES)


def _tile_view(q: torch.Tensor) -> torch.Tensor:
    """q [n, k] as [row block, row i, k-block j, side (inputs 0-15 or 16-31), vector v, byte b]."""
    return q.view(q.shape[0] // LANES, LANES, q.shape[1] // GROUP, 2, 4, 4)


def _plane(t: torch.Tensor) -> torch.Tensor:
    """Nibbles in `_tile_view`'s shape -> their tiles' plane [rb, kb, 4, 64]: vector v, byte 4i + b holds row i
    at input 4v + b in its low nibble and at 16 + 4v + b in its high one."""
    rb, _, kb = t.shape[:3]
    return (t[:, :, :, 0] | (t[:, :, :, 1] << 4)).permute(0, 2, 3, 1, 4).reshape(rb, kb, 4, 4 * LANES)


def _pack_rows(q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, bits: int) -> torch.Tensor:
    _, high_bits, groups, _ = FORMATS[bits]
    n, k = q.shape
    rb, kb = n // LANES, k // GROUP
    q6 = _tile_view(q)
    parts = [_plane(q6 & 0x0F).reshape(rb, kb, 256)]
    if high_bits:
        h = _plane(q6 >> 4)  # H[v]
        if high_bits == 2:
            h = h[:, :, 0::2] | (h[:, :, 1::2] << 2)
        elif high_bits == 1:
            h = h[:, :, 0] | (h[:, :, 1] << 1) | (h[:, :, 2] << 2) | (h[:, :, 3] << 3)
        parts.append(h.reshape(rb, kb, -1))
    for t in (scale,) if bias is None else (scale, bias):  # [n, k / group] -> [rb, kb, groups, 16] float16, as bytes
        halves = t.view(rb, LANES, kb, groups).permute(0, 2, 3, 1).to(torch.float16)
        if not torch.isfinite(halves).all():
            raise ValueError("cannot pack: a scale or bias overflows float16")
        parts.append(halves.contiguous().view(torch.uint8).reshape(rb, kb, 2 * LANES * groups))
    return torch.cat(parts, dim=-1)


def linear(x: torch.Tensor, parts: list[torch.Tensor], act_bits: int = 16) -> torch.Tensor:
    """x [T, K] -> [T, sum of the parts' N] in x's dtype: x @ W.T for the row-concatenation of `parts`."""
    return torch.ops.kvstrata.int_dot_linear(x.contiguous(), parts, act_bits)


_ALL = torch.empty(0, dtype=torch.long)


def dequantize(packed: torch.Tensor, dtype: torch.dtype, rows: torch.Tensor | None = None,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """The dense rows `rows` (default all) of `packed` [N, K] in `dtype`, written into `out` if given."""
    n = packed.shape[0] * LANES if rows is None else rows.numel()
    if out is None:
        out = torch.empty(n, packed.shape[1] * GROUP, dtype=dtype)
    torch.ops.kvstrata.int_dot_dequant(packed, _ALL if rows is None else rows.contiguous(), out)
    return out
