// The AVX2 tile loops of q4, q4s and q4k (int_dot_avx2.h): the weights' nibble planes (q <= 15, no
// high bits) against the activation bytes, vpmaddubsw pair sums in 16 bits, in halves of 8 output rows a
// ymm; passes of up to 4 rows over both halves (q4_tiles), or at 8-bit activations from kRowsHalfMin rows
// one half at a time for all rows (q4_rows_half).
#pragma once

#include "int_dot_avx2_common.h"

#if KVSTRATA_AVX2
namespace kvstrata_int_dot {

inline __m256 bytes8(const uint8_t* p) {  // 8 unsigned bytes as floats
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

enum class Q4 { kStored, kSymmetric, kBlocks };  // the q4 formats: q4, q4s, q4k (int_dot_common.h)

// Tile j's scales and biases for the 8 output rows of half h (wb: the tile, w: its column): d * sc and
// -dmin * m (q4k), else the stored float16 scales and biases (a symmetric format's from its scales)
template <Q4 M>
inline void q4_half_scales(const uint8_t* w, const uint8_t* wb, int64_t j, int h, __m256& sc, __m256& bi) {
  constexpr Format f = M == Q4::kBlocks ? kQ4k : M == Q4::kSymmetric ? kQ4s : kQ4;
  if constexpr (M == Q4::kBlocks) {
    const uint8_t* dm = k_super_scales(w, j);
    sc = _mm256_mul_ps(HALVES(dm + 16 * h), bytes8(wb + kLowBytes + 8 * h));
    bi = _mm256_mul_ps(HALVES(dm + 32 + 16 * h), bytes8(wb + kLowBytes + kLanes + 8 * h));
  } else {
    sc = HALVES(wb + kLowBytes + 16 * h);
    bi = biases<M == Q4::kSymmetric>(wb + kLowBytes + 32 + 16 * h, sc, f);
  }
}

// q4: out[r][i] for N <= 4 rows from r0 of one tile column, both halves of each tile (half h: output
// rows 8h..8h+7) in one pass, so the column streams once (W: wide, 16-bit activations; else 8-bit ones,
// whose hi bytes are 0 and skipped; M: which q4 format)
template <int N, bool W, Q4 M>
void q4_tiles(const Activations& a, int64_t r0, int64_t K, const uint8_t* w, float* out /* [N][16] */) {
  constexpr int NH = 2;
  constexpr Format f = M == Q4::kBlocks ? kQ4k : M == Q4::kSymmetric ? kQ4s : kQ4;
  const int64_t nb = K / kGroup;
  __m256 acc[N][NH];
  for (int r = 0; r < N; ++r)
    for (int h = 0; h < NH; ++h) acc[r][h] = _mm256_setzero_ps();
  const __m256i mask = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  for (int64_t j = 0; j < nb; ++j) {
    const uint8_t* wb = tile_at(w, j, f);
    prefetch_ahead(wb, f.bytes());
    __m256i sh[N][NH], sl[N][NH];  // 16-bit pair sums
    for (int r = 0; r < N; ++r)
      for (int h = 0; h < NH; ++h) sh[r][h] = sl[r][h] = _mm256_setzero_si256();
    for (int v = 0; v < 4; ++v) {
      for (int h = 0; h < NH; ++h) {
        const __m256i raw = LOADU(wb + 64 * v + 32 * h);
        const __m256i lo = _mm256_and_si256(raw, mask), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
        for (int r = 0; r < N; ++r) {
          const int8_t* xl = a.lo.data() + (r0 + r) * K + j * kGroup;
          if constexpr (W) {
            const int8_t* xh = a.hi.data() + (r0 + r) * K + j * kGroup;
            sh[r][h] = _mm256_add_epi16(sh[r][h], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(load4(xh + 4 * v))));
            sh[r][h] = _mm256_add_epi16(sh[r][h], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(load4(xh + 16 + 4 * v))));
          }
          sl[r][h] = _mm256_add_epi16(sl[r][h], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(load4(xl + 4 * v))));
          sl[r][h] = _mm256_add_epi16(sl[r][h], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(load4(xl + 16 + 4 * v))));
        }
      }
    }
    for (int h = 0; h < NH; ++h) {
      __m256 sc, bi;
      q4_half_scales<M>(w, wb, j, h, sc, bi);
      for (int r = 0; r < N; ++r) {
        __m256i dot = _mm256_madd_epi16(sl[r][h], ones);
        if constexpr (W) dot = _mm256_add_epi32(_mm256_slli_epi32(_mm256_madd_epi16(sh[r][h], ones), 8), dot);
        const float sx = a.scale[(r0 + r) * nb + j], xs = a.sum[(r0 + r) * nb + j];
        acc[r][h] = _mm256_fmadd_ps(_mm256_mul_ps(sc, _mm256_set1_ps(sx)), _mm256_cvtepi32_ps(dot), acc[r][h]);
        acc[r][h] = _mm256_fmadd_ps(bi, _mm256_set1_ps(xs), acc[r][h]);
      }
    }
  }
  for (int r = 0; r < N; ++r)
    for (int h = 0; h < NH; ++h) _mm256_storeu_ps(out + r * kLanes + 8 * h, acc[r][h]);
}

// q4 at 8-bit activations, R <= kMaxRows rows from r0 (a wide step's pass): one half of each tile at a
// time, its 4 x 2 nibble vectors unpacked once for all R rows (8 registers), each row's dot as two
// chains of 4 vpmaddubsw (16-bit sums, 8 x 2 x 15 x 128 < 2^15) and its float accumulators in out
// (L1), so nothing spills. The same integers and float operations as q4_tiles (the same bits).
template <Q4 M>
void q4_rows_half(const Activations& a, int64_t r0, int R, int64_t K, const uint8_t* w, float* out, int h) {
  constexpr Format f = M == Q4::kBlocks ? kQ4k : M == Q4::kSymmetric ? kQ4s : kQ4;
  const int64_t nb = K / kGroup;
  const __m256i mask = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(out + r * kLanes + 8 * h, _mm256_setzero_ps());
  for (int64_t j = 0; j < nb; ++j) {
    const uint8_t* wb = tile_at(w, j, f);
    if (h == 0) prefetch_ahead(wb, f.bytes());
    __m256i lo[4], hi[4];
    for (int v = 0; v < 4; ++v) {
      const __m256i raw = LOADU(wb + 64 * v + 32 * h);
      lo[v] = _mm256_and_si256(raw, mask);
      hi[v] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
    }
    __m256 sc, bi;
    q4_half_scales<M>(w, wb, j, h, sc, bi);
    const int8_t* x = a.lo.data() + r0 * K + j * kGroup;
    for (int r = 0; r < R; ++r, x += K) {
      __m256i s0 = _mm256_maddubs_epi16(lo[0], _mm256_set1_epi32(load4(x)));
      __m256i s1 = _mm256_maddubs_epi16(hi[0], _mm256_set1_epi32(load4(x + 16)));
      for (int v = 1; v < 4; ++v) {
        s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(lo[v], _mm256_set1_epi32(load4(x + 4 * v))));
        s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(hi[v], _mm256_set1_epi32(load4(x + 16 + 4 * v))));
      }
      const __m256i dot = _mm256_madd_epi16(_mm256_add_epi16(s0, s1), ones);
      const int64_t at = (r0 + r) * nb + j;
      float* o = out + r * kLanes + 8 * h;
      __m256 acc = _mm256_loadu_ps(o);
      acc = _mm256_fmadd_ps(_mm256_mul_ps(sc, _mm256_set1_ps(a.scale[at])), _mm256_cvtepi32_ps(dot), acc);
      acc = _mm256_fmadd_ps(bi, _mm256_set1_ps(a.sum[at]), acc);
      _mm256_storeu_ps(o, acc);
    }
  }
}

// q4: passes of at most 4 rows (q4_tiles); at 8-bit activations, kRowsHalfMin rows or more in one pass a
// half (q4_rows_half): from 8 rows a half at a time (its column read twice) runs faster than passes of 4
// rows on random q4k and q4 tiles (docs/cpu-kernels.md has the figures).
constexpr int kRowsHalfMin = 8;

template <bool W, Q4 M>
void q4_passes(const Activations& a, int64_t r0, int R, int64_t K, const uint8_t* w, float* out) {
  if (!W && R >= kRowsHalfMin) {
    q4_rows_half<M>(a, r0, R, K, w, out, 0);
    q4_rows_half<M>(a, r0, R, K, w, out, 1);
    return;
  }
  for (int r = 0; r < R; r += 4) {
    const int n = std::min(R - r, 4);
    float* o = out + r * kLanes;
    if (n == 4) q4_tiles<4, W, M>(a, r0 + r, K, w, o);
    else if (n == 3) q4_tiles<3, W, M>(a, r0 + r, K, w, o);
    else if (n == 2) q4_tiles<2, W, M>(a, r0 + r, K, w, o);
    else q4_tiles<1, W, M>(a, r0 + r, K, w, o);
  }
}

}  // namespace kvstrata_int_dot
#endif
