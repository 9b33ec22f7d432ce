// The q4 and q8 formats of csrc/int_dot_linear.cpp on AMX tiles (Sapphire Rapids and later, built where
// the compiler targets AMX-INT8): a tile column's 16 output rows for up to 16 activation rows a pass.
//
// Why: a verify step (engine/spec/) or a wide decode batch gives each linear 8-32 rows. On AVX512-VNNI a
// row costs 16 vpdpbusd a tile (hi and lo activation bytes), so at 16 rows the kernel computes, it does
// not wait on memory. AMX's tdpbsud takes a whole tile column's group at once: s8 activations (A: rows x
// 32 inputs, loaded straight from the quantized rows with their stride) times u8 weights (B: 8 rows of
// 64 bytes, "four inputs of 16 output rows a row", which is exactly the low plane's layout once each
// vector's nibbles are split: lo[v] is B's row v, hi[v] its row 4 + v; q8 adds the high plane's nibbles
// on top) into 16 int32 dots a row.
// Integer dots are exact, so each (row, group) dot equals the VNNI path's, and the float epilogue is the
// VNNI path's operations in its order: the same bits for any row count (tests/model/test_int_dot_amx.py).
// Tiles are configured per thread for the pass's row count (amx_tiles.h).
#pragma once

#include <algorithm>

#include "int_dot_common.h"

#if defined(__AVX512F__)
#include <immintrin.h>

namespace kvstrata_int_dot {

// tile j's 16 scales and biases (q4, q4s, q4k; on AMX also q8, q8s) in float32 (the VNNI and AMX forms)
inline void q4_scales_512(const uint8_t* w, const uint8_t* wb, int64_t j, Format f, __m512& sc, __m512& bi) {
  auto halves = [](const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); };
  if (f.kblocks) {  // d * sc, -dmin * m (int_dot_common.h)
    const uint8_t* dm = k_super_scales(w, j);
    auto bytes16 = [](const uint8_t* p) {
      return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
    };
    sc = _mm512_mul_ps(halves(dm), bytes16(wb + kLowBytes));
    bi = _mm512_mul_ps(halves(dm + 32), bytes16(wb + kLowBytes + kLanes));
  } else {
    const uint8_t* sp = wb + kLowBytes + f.high_bytes();  // q8: after the high plane
    sc = halves(sp);
    bi = f.symmetric ? _mm512_mul_ps(sc, _mm512_set1_ps(-f.zero())) : halves(sp + 32);
  }
}

}  // namespace kvstrata_int_dot
#endif

#include "amx_tiles.h"  // defines KVSTRATA_AMX where it builds

#if KVSTRATA_AMX
namespace kvstrata_int_dot {

constexpr int kAmxRows = 16;  // activation rows a pass (a tile's rows)

// tiles: 0, 1 the int32 dots of the hi and lo activation bytes [R x 16]; 2, 3 those bytes [R x 32];
// 4 one group of the weights' q as u8 [8 x 64]; 5, 6 and 7: 0, 1 and 4 of a second tile column (amx_q4_pair)
inline void amx_q4_shapes(kvstrata::TileShapes& t, int R) {
  for (int i : {0, 1, 5, 6}) t.set(i, R, 64);
  for (int i : {2, 3}) t.set(i, R, kGroup);
  for (int i : {4, 7}) t.set(i, 8, 64);
  t.load();
}

// a group's 32 x 16 q as B's 8 rows of 64 bytes (the low plane's lo[v] row v, hi[v] row 4 + v); q8 (the
// only other format on these tiles) ors in the high plane's nibbles as each byte's top four bits
inline void group_bytes(const uint8_t* wb, Format f, uint8_t* q) {
  const __m512i mask = _mm512_set1_epi8(0x0F), top = _mm512_set1_epi8(static_cast<char>(0xF0));
  for (int v = 0; v < 4; ++v) {
    const __m512i raw = _mm512_loadu_si512(wb + 64 * v);
    __m512i lo = _mm512_and_si512(raw, mask), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), mask);
    if (f.high_bits == 4) {
      const __m512i H = _mm512_loadu_si512(wb + kLowBytes + 64 * v);
      lo = _mm512_or_si512(lo, _mm512_slli_epi16(_mm512_and_si512(H, mask), 4));
      hi = _mm512_or_si512(hi, _mm512_and_si512(H, top));
    }
    _mm512_store_si512(q + 64 * v, lo);
    _mm512_store_si512(q + 64 * (4 + v), hi);
  }
}

// out[r] += a group's dots (dh, dl: R x 16 int32) scaled, the VNNI path's float operations in its order
inline void q4_group_epilogue(const Activations& a, int64_t r0, int R, int64_t nb, int64_t j, const uint8_t* w,
                              const uint8_t* wb, Format f, const int32_t* dh, const int32_t* dl, float* out) {
  __m512 sc, bi;
  q4_scales_512(w, wb, j, f, sc, bi);
  for (int r = 0; r < R; ++r) {
    const __m512i lo = _mm512_load_si512(dl + r * kLanes);
    const __m512i dot = a.wide ? _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(dh + r * kLanes), 8), lo) : lo;
    const int64_t at = (r0 + r) * nb + j;
    float* o = out + r * kLanes;
    __m512 acc = _mm512_loadu_ps(o);
    acc = _mm512_fmadd_ps(_mm512_mul_ps(sc, _mm512_set1_ps(a.scale[at])), _mm512_cvtepi32_ps(dot), acc);
    acc = _mm512_fmadd_ps(bi, _mm512_set1_ps(a.sum[at]), acc);
    _mm512_storeu_ps(o, acc);
  }
}

// amx_column for two tile columns of one weight (wa, wb: their first groups) and up to 16 rows on the same
// activation tiles: four independent dots a group where one column's two waited on each other; the same
// integers and epilogue, so the same bits. out: [2][R x 16]
inline void amx_q4_pair(const Activations& a, int64_t r0, int R, int64_t K, const uint8_t* wa, const uint8_t* wb,
                        Format f, float* out) {
  const int64_t nb = K / kGroup;
  alignas(64) uint8_t qa[8 * 64], qb[8 * 64];
  alignas(64) int32_t dh[2][kAmxRows * kLanes], dl[2][kAmxRows * kLanes];
  for (int r = 0; r < 2 * R; ++r) _mm512_storeu_ps(out + r * kLanes, _mm512_setzero_ps());
  const int8_t* xh = a.hi.data() + r0 * K;
  const int8_t* xl = a.lo.data() + r0 * K;
  for (int64_t j = 0; j < nb; ++j) {
    const uint8_t* ga = tile_at(wa, j, f);
    const uint8_t* gb = tile_at(wb, j, f);
    group_bytes(ga, f, qa);
    group_bytes(gb, f, qb);
    _tile_loadd(4, qa, 64);
    _tile_loadd(7, qb, 64);
    _tile_zero(1);
    _tile_zero(6);
    _tile_loadd(3, xl + j * kGroup, K);
    if (a.wide) {
      _tile_zero(0);
      _tile_zero(5);
      _tile_loadd(2, xh + j * kGroup, K);
    }
    _tile_dpbsud(1, 3, 4);
    _tile_dpbsud(6, 3, 7);
    if (a.wide) {
      _tile_dpbsud(0, 2, 4);
      _tile_dpbsud(5, 2, 7);
    }
    _tile_stored(1, dl[0], 64);
    _tile_stored(6, dl[1], 64);
    if (a.wide) {
      _tile_stored(0, dh[0], 64);
      _tile_stored(5, dh[1], 64);
    }
    q4_group_epilogue(a, r0, R, nb, j, wa, ga, f, dh[0], dl[0], out);
    q4_group_epilogue(a, r0, R, nb, j, wb, gb, f, dh[1], dl[1], out + R * kLanes);
  }
}

// tiles for amx_column: 0, 1 the int32 dots of rows 0-15 and 16..R-1; 2, 3 their activation bytes; 4 the
// group's q (amx_q4_shapes's 4). With 16 rows or fewer, 1 and 3 are unused (one row each: a valid shape)
inline void amx_column_shapes(kvstrata::TileShapes& t, int R) {
  const int R1 = std::max(1, R - kAmxRows);
  t.set(0, std::min(R, kAmxRows), 64);
  t.set(1, R1, 64);
  t.set(2, std::min(R, kAmxRows), kGroup);
  t.set(3, R1, kGroup);
  t.set(4, 8, 64);
  t.load();
}

// out[r][i] for rows r0..r0+R-1 (R <= 32) of one tile column (this thread's tiles shaped for R:
// amx_column_shapes): each group's q is built and loaded once for both 16-row blocks. out: [R x 16]
inline void amx_column(const Activations& a, int64_t r0, int R, int64_t K, const uint8_t* w, Format f, float* out) {
  const int64_t nb = K / kGroup;
  const int R0 = std::min(R, kAmxRows), R1 = R - R0;
  alignas(64) uint8_t q[8 * 64];
  alignas(64) int32_t dh[2][kAmxRows * kLanes], dl[2][kAmxRows * kLanes];
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + r * kLanes, _mm512_setzero_ps());
  const int8_t* xl = a.lo.data() + r0 * K;
  const int8_t* xh = a.hi.data() + r0 * K;
  for (int64_t j = 0; j < nb; ++j) {
    const uint8_t* wb = tile_at(w, j, f);
    group_bytes(wb, f, q);
    _tile_loadd(4, q, 64);
    for (int plane = a.wide ? 0 : 1; plane < 2; ++plane) {  // 0: the activations' high bytes, 1: the low
      const int8_t* x = plane ? xl : xh;
      _tile_zero(0);
      _tile_loadd(2, x + j * kGroup, K);
      _tile_dpbsud(0, 2, 4);
      _tile_stored(0, plane ? dl[0] : dh[0], 64);
      if (R1) {
        _tile_zero(1);
        _tile_loadd(3, x + kAmxRows * K + j * kGroup, K);
        _tile_dpbsud(1, 3, 4);
        _tile_stored(1, plane ? dl[1] : dh[1], 64);
      }
    }
    q4_group_epilogue(a, r0, R0, nb, j, w, wb, f, dh[0], dl[0], out);
    if (R1) q4_group_epilogue(a, r0 + kAmxRows, R1, nb, j, w, wb, f, dh[1], dl[1], out + kAmxRows * kLanes);
  }
}

}  // namespace kvstrata_int_dot

#endif
