"""A GGUF tensor's quantized blocks as integers with per-group scale and bias: `IntWeight`.

Every block type the integer-dot kernels run (int_dot.py) has the same shape once unpacked:
    w[n, k] = scale[n, k // group] * q[n, k] + bias[n, k // group],   q an unsigned integer of `bits` bits
    Q4_0  q = nibble               scale = d          bias = -8 d          (bits 4, group 32)
    Q4_1  q = nibble               scale = d          bias = m
    Q5_0  q = nibble | qh << 4     scale = d          bias = -16 d         (bits 5)
    Q5_1  q = nibble | qh << 4     scale = d          bias = m
    Q8_0  q = int8 + 128           scale = d          bias = -128 d        (bits 8)
    Q4_K  q = nibble               scale = d * sc_s   bias = -dmin * m_s   (super-block of 256: 8 groups of 32)
    Q5_K  q = nibble | qh << 4     scale = d * sc_s   bias = -dmin * m_s   (bits 5)
    Q6_K  q = ql | qh << 4         scale = d * sc_s   bias = -32 scale     (bits 6, group 16: sc_s an int8)
The unpacking follows the byte layouts of llama.cpp's ggml-quants (as the `gguf` package's
`dequantize` reads them; tests/model/quant/test_blocks.py checks every type against it on random
blocks). Scale and bias come back in float32 (exact: products of a float16 and an integer of at most
8 bits); the kernels' packing holds them in float16. The symmetric types (bias = -zero scale: Q4_0, Q5_0,
Q8_0, Q6_K) say so in `zero`, and the packing then keeps no biases (int_dot.py). Q4_K also comes back as
its own scale encoding (`KScales`: d and dmin a super-block, 6-bit sc and m a group), which the packing
keeps instead of float16 products.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

QK_K = 256  # values per K-quant super-block
# type name -> (values per block, bytes per block, bits of q, values per scale group)
BLOCK_TYPES: dict[str, tuple[int, int, int, int]] = {
    "Q4_0": (32, 18, 4, 32), "Q4_1": (32, 20, 4, 32), "Q5_0": (32, 22, 5, 32), "Q5_1": (32, 24, 5, 32),
    "Q8_0": (32, 34, 8, 32), "Q4_K": (QK_K, 144, 4, 32), "Q5_K": (QK_K, 176, 5, 32), "Q6_K": (QK_K, 210, 6, 16),
}
SYMMETRIC = {"Q4_0": 8, "Q5_0": 16, "Q8_0": 128, "Q6_K": 32}  # type -> zero: bias = -zero * scale (2^(bits - 1))


@dataclass
class KScales:
    """Q4_K's scales as the file holds them: scale = d * sc, bias = -dmin * m."""

    d: torch.Tensor  # [N, K / 256] float32 (float16 values)
    dmin: torch.Tensor  # [N, K / 256] float32 (float16 values)
    sc: torch.Tensor  # [N, K / 32] uint8 (6-bit)
    m: torch.Tensor  # [N, K / 32] uint8 (6-bit)

    def rows(self, index: torch.Tensor) -> KScales:
        return KScales(self.d[index], self.dmin[index], self.sc[index], self.m[index])


@dataclass
class IntWeight:
    """w[n, k] = scale[n, k // group] * q[n, k] + bias[n, k // group]."""

    q: torch.Tensor  # [N, K] uint8, values below 2**bits
    scale: torch.Tensor  # [N, K / group] float32
    bias: torch.Tensor  # [N, K / group] float32
    bits: int
    group: int
    zero: int = 0  # > 0: bias == -zero * scale everywhere (a symmetric type; zero = 2^(bits - 1))
    kscales: KScales | None = None  # Q4_K: its scales as the file encodes them (scale, bias = their products)

    def dequantize(self) -> torch.Tensor:  # [N, K] float32
        s = self.scale.repeat_interleave(self.group, dim=1)
        b = self.bias.repeat_interleave(self.group, dim=1)
        return s * self.q.to(torch.float32) + b

    def rows(self, index: torch.Tensor) -> IntWeight:
        """The rows `index` (a permutation of output rows, e.g. llama.cpp's Q/K order undone)."""
        ks = self.kscales.rows(index) if self.kscales is not None else None
        return IntWeight(self.q[index], self.scale[index], self.bias[index], self.bits, self.group, self.zero, ks)


def block_type(type_name: str, shape: tuple[int, ...]) -> tuple[int, int, int, int] | None:
    """The BLOCK_TYPES entry of a 2-D tensor of this type and shape [N, K], else None."""
    spec = BLOCK_TYPES.get(type_name)
    if spec is None or len(shape) != 2 or shape[1] % spec[0]:
        return None
    return spec


def decode_blocks(raw: np.ndarray, type_name: str, shape: tuple[int, int]) -> IntWeight:
    """raw [rows, bytes per row] of a GGUF tensor of `shape` [N, K] (rows may be a slice of N) -> IntWeight."""
    spec = block_type(type_name, shape)
    if spec is None:
        raise ValueError(f"{type_name} {shape}: not a block type of the integer-dot kernels")
    per, nbytes, bits, group = spec
    rows, K = raw.shape[0], shape[1]
    b = np.ascontiguousarray(raw).reshape(rows * (K // per), nbytes)  # one row per block
    q, scale, bias = _DECODERS[type_name](b)
    t = lambda a, cols, dtype=np.float32: torch.from_numpy(np.ascontiguousarray(a.reshape(rows, cols), dtype=dtype))  # noqa: E731
    ks = None
    if type_name == "Q4_K":
        sc, mn = _k_scales(b[:, 4:16])
        ks = KScales(t(_f16(b, 0), K // QK_K), t(_f16(b, 2), K // QK_K), t(sc, K // 32, np.uint8), t(mn, K // 32, np.uint8))
    return IntWeight(t(q, K, np.uint8), t(scale, K // group), t(bias, K // group), bits, group, SYMMETRIC.get(type_name, 0), ks)


Unpacked = tuple[np.ndarray, np.ndarray, np.ndarray]  # q [blocks, per] uint8, scale and bias [blocks, groups]


def _f16(b: np.ndarray, at: int) -> np.ndarray:  # [blocks, 1] float32 from the float16 at byte `at`
    return b[:, at:at + 2].copy().view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray, span: int) -> np.ndarray:
    """qs [blocks, bytes] -> [blocks, 2 * bytes]: per run of `span` bytes, the low nibbles then the high ones."""
    n = qs.shape[0]
    q = qs.reshape(n, -1, 1, span) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (q & 0x0F).reshape(n, -1)


def _high_bits(qh: np.ndarray, bit: int) -> np.ndarray:  # Q5_0/Q5_1: bit t of a little-endian uint32 -> value t
    bits = qh.copy().view(np.uint32) >> np.arange(32, dtype=np.uint32).reshape(1, 32)
    return ((bits & 1).astype(np.uint8) << bit).reshape(qh.shape[0], 32)


def _q4_0(b: np.ndarray) -> Unpacked:
    d = _f16(b, 0)
    return _nibbles(b[:, 2:], 16), d, -8 * d


def _q4_1(b: np.ndarray) -> Unpacked:
    return _nibbles(b[:, 4:], 16), _f16(b, 0), _f16(b, 2)


def _q5_0(b: np.ndarray) -> Unpacked:
    d = _f16(b, 0)
    return _nibbles(b[:, 6:], 16) | _high_bits(b[:, 2:6], 4), d, -16 * d


def _q5_1(b: np.ndarray) -> Unpacked:
    return _nibbles(b[:, 8:], 16) | _high_bits(b[:, 4:8], 4), _f16(b, 0), _f16(b, 2)


def _q8_0(b: np.ndarray) -> Unpacked:
    d = _f16(b, 0)
    return b[:, 2:] ^ np.uint8(0x80), d, -128 * d  # int8 + 128 as uint8


def _k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes of 6-bit scales and mins -> (sc, m), [blocks, 8] each."""
    d, m, md = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _q4_k(b: np.ndarray) -> Unpacked:
    sc, mn = _k_scales(b[:, 4:16])
    return _nibbles(b[:, 16:], 32), _f16(b, 0) * sc, -_f16(b, 2) * mn


def _q5_k(b: np.ndarray) -> Unpacked:
    sc, mn = _k_scales(b[:, 4:16])
    n = b.shape[0]
    qh = b[:, 16:48].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)  # bit s: group s
    return _nibbles(b[:, 48:], 32) | ((qh & 1).reshape(n, QK_K) << 4), _f16(b, 0) * sc, -_f16(b, 2) * mn


def _q6_k(b: np.ndarray) -> Unpacked:
    n = b.shape[0]
    ql = _nibbles(b[:, 0:128], 64)  # [n, 256]: per half of the super-block, 64 low nibbles then 64 high ones
    qh = b[:, 128:192].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    q = ql | ((qh & 3).reshape(n, QK_K) << 4)
    scale = _f16(b, 208) * b[:, 192:208].view(np.int8).astype(np.float32)  # [n, 16]
    return q, scale, -32 * scale


_DECODERS = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q8_0": _q8_0,
             "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k}
