// The AVX2 forms of csrc/int_dot_linear.cpp's tile loops (x86-64-v3: AVX2, FMA, F16C; also run on
// AVX-512 CPUs for q5/q6/q8): one tile column's output rows for a few activation rows at a time, in
// halves of 8 output rows a ymm. Templated on W: 16-bit activations (hi and lo bytes), or 8-bit ones
// (lo only: half the products). The same integers and float operations as the portable loops.
#pragma once

#include "int_dot_common.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define KVSTRATA_AVX2 1
#include <immintrin.h>

namespace kvstrata_int_dot {

constexpr int kPrefetch = 8;  // tiles ahead (prefetch_ahead)

#define LOADU(p) _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
#define HALVES(p) _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))

// The tile kPrefetch tiles on, into L1, while this one is computed (by passes that start at the first
// half; where each half has its own pass, the second finds the column in L1 or L2). A tile column is
// contiguous and the next one follows it, so the hardware prefetchers would find the stream too, but
// late: at one row a step the kernel waited on memory (docs/benchmarks.md: a 1B Q4_K_M decode step,
// bench/step_profile.py --ab-act-bits).
inline void prefetch_ahead(const uint8_t* wb, int64_t tile_bytes) {
  const uint8_t* p = wb + kPrefetch * tile_bytes;
  for (int64_t l = 0; l < tile_bytes; l += 64) _mm_prefetch(reinterpret_cast<const char*>(p + l), _MM_HINT_T0);
}

// A tile's 8 biases from `bias` (float16), or for a symmetric format (S) its scales `sc` times -zero
template <bool S>
inline __m256 biases(const uint8_t* bias, __m256 sc, Format f) {
  if constexpr (S) return _mm256_mul_ps(sc, _mm256_set1_ps(-f.zero()));
  else return HALVES(bias);
}

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

// H[v] of half h: the high bits of inputs 4v.. (bits 0-3) and 16 + 4v.. (bits 4-7)
template <int HB>
inline __m256i high_vec(const uint8_t* hp, int v, int h) {
  if constexpr (HB == 4) {
    return LOADU(hp + 64 * v + 32 * h);
  } else if constexpr (HB == 2) {
    const __m256i p = LOADU(hp + 64 * (v / 2) + 32 * h);
    return _mm256_and_si256(v % 2 ? _mm256_srli_epi16(p, 2) : p, _mm256_set1_epi8(0x33));
  } else {
    const __m256i p = LOADU(hp + 32 * h);
    return _mm256_and_si256(_mm256_srl_epi16(p, _mm_cvtsi32_si128(v)), _mm256_set1_epi8(0x11));
  }
}

inline __m256i pair_sums(__m256i s16) { return _mm256_madd_epi16(s16, _mm256_set1_epi16(1)); }

// q5/q6/q8: out[r][8 h + i] for kRows <= 2 rows from r0, kHalves halves from h0 (kHalves = 2 streams the
// column once; kHalves = 1, a half a pass, is for passes whose accumulators would not fit both);
// (kHighBits, kGroups, kSymmetric) = the format's (high bits, groups, symmetric)
template <int kHighBits, int kGroups, bool kSymmetric, int kRows, bool kWide, int kHalves>
void hb_half(const Activations& a, int64_t r0, int64_t K, const uint8_t* w, int h0, float* out /* [kRows][16] */) {
  constexpr Format f{kHighBits, kGroups, kSymmetric};
  const int64_t nb = K / kGroup;
  __m256 acc[kRows][kHalves];
  for (int r = 0; r < kRows; ++r)
    for (int h = 0; h < kHalves; ++h) acc[r][h] = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0x0F), m4h = _mm256_set1_epi8(static_cast<char>(0xF0));
  for (int64_t j = 0; j < nb; ++j) {
    const uint8_t* wb = w + j * f.bytes();
    if (h0 == 0) prefetch_ahead(wb, f.bytes());
    const uint8_t* sp = wb + kLowBytes + f.high_bytes();
    // 32-bit dots with the hi and lo activation bytes, per group
    __m256i dh[kRows][kHalves][kGroups], dl[kRows][kHalves][kGroups];
    for (int r = 0; r < kRows; ++r)
      for (int h = 0; h < kHalves; ++h)
        for (int g = 0; g < kGroups; ++g) dh[r][h][g] = dl[r][h][g] = _mm256_setzero_si256();
    for (int v = 0; v < 4; ++v) for (int h = 0; h < kHalves; ++h) {
      const __m256i raw = LOADU(wb + 64 * v + 32 * (h0 + h));
      const __m256i lo = _mm256_and_si256(raw, m4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
      const __m256i H = high_vec<kHighBits>(wb + kLowBytes, v, h0 + h);
      for (int r = 0; r < kRows; ++r) {
        const int8_t* xh = a.hi.data() + (r0 + r) * K + j * kGroup;
        const int8_t* xl = a.lo.data() + (r0 + r) * K + j * kGroup;
        const __m256i ha = _mm256_set1_epi32(load4(xh + 4 * v)), hb = _mm256_set1_epi32(load4(xh + 16 + 4 * v));
        const __m256i la = _mm256_set1_epi32(load4(xl + 4 * v)), lb = _mm256_set1_epi32(load4(xl + 16 + 4 * v));
        if constexpr (kHighBits == 4) {  // q up to 255: the nibble planes apart (each product pair <= 2 x 15 x 128)
          const __m256i qa = _mm256_and_si256(H, m4), qb = _mm256_and_si256(_mm256_srli_epi16(H, 4), m4);
          if constexpr (kWide) {
            const __m256i th = _mm256_add_epi16(_mm256_maddubs_epi16(qa, ha), _mm256_maddubs_epi16(qb, hb));
            const __m256i sh = _mm256_add_epi16(_mm256_maddubs_epi16(lo, ha), _mm256_maddubs_epi16(hi, hb));
            dh[r][h][0] = _mm256_add_epi32(dh[r][h][0], _mm256_add_epi32(pair_sums(sh), _mm256_slli_epi32(pair_sums(th), 4)));
          }
          const __m256i tl = _mm256_add_epi16(_mm256_maddubs_epi16(qa, la), _mm256_maddubs_epi16(qb, lb));
          const __m256i sl = _mm256_add_epi16(_mm256_maddubs_epi16(lo, la), _mm256_maddubs_epi16(hi, lb));
          dl[r][h][0] = _mm256_add_epi32(dl[r][h][0], _mm256_add_epi32(pair_sums(sl), _mm256_slli_epi32(pair_sums(tl), 4)));
        } else {  // q up to 63: one byte, one product pair <= 2 x 63 x 128
          const __m256i qa = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(H, m4), 4));
          const __m256i qb = _mm256_or_si256(hi, _mm256_and_si256(H, m4h));
          const __m256i pla = _mm256_maddubs_epi16(qa, la), plb = _mm256_maddubs_epi16(qb, lb);
          if constexpr (kWide) {
            const __m256i pha = _mm256_maddubs_epi16(qa, ha), phb = _mm256_maddubs_epi16(qb, hb);
            if constexpr (kGroups == 1) {
              dh[r][h][0] = _mm256_add_epi32(dh[r][h][0], pair_sums(_mm256_add_epi16(pha, phb)));
            } else {
              dh[r][h][0] = _mm256_add_epi32(dh[r][h][0], pair_sums(pha));
              dh[r][h][kGroups - 1] = _mm256_add_epi32(dh[r][h][kGroups - 1], pair_sums(phb));
            }
          }
          if constexpr (kGroups == 1) {
            dl[r][h][0] = _mm256_add_epi32(dl[r][h][0], pair_sums(_mm256_add_epi16(pla, plb)));
          } else {
            dl[r][h][0] = _mm256_add_epi32(dl[r][h][0], pair_sums(pla));
            dl[r][h][kGroups - 1] = _mm256_add_epi32(dl[r][h][kGroups - 1], pair_sums(plb));
          }
        }
      }
    }
    for (int r = 0; r < kRows; ++r) for (int h = 0; h < kHalves; ++h) {
      const int64_t at = (r0 + r) * nb + j;
      const __m256 sx = _mm256_set1_ps(a.scale[at]);
      for (int g = 0; g < kGroups; ++g) {
        const __m256i dot = kWide ? _mm256_add_epi32(_mm256_slli_epi32(dh[r][h][g], 8), dl[r][h][g]) : dl[r][h][g];
        acc[r][h] = _mm256_fmadd_ps(_mm256_mul_ps(HALVES(sp + 32 * g + 16 * (h0 + h)), sx), _mm256_cvtepi32_ps(dot), acc[r][h]);
      }
      for (int g = 0; g < kGroups; ++g) {
        const float xs = kGroups == 1 ? a.sum[at] : a.sum16[2 * at + g];
        const __m256 bi = biases<kSymmetric>(sp + 32 * kGroups + 32 * g + 16 * (h0 + h),
                                             HALVES(sp + 32 * g + 16 * (h0 + h)), f);
        acc[r][h] = _mm256_fmadd_ps(bi, _mm256_set1_ps(xs), acc[r][h]);
      }
    }
  }
  for (int r = 0; r < kRows; ++r)
    for (int h = 0; h < kHalves; ++h) _mm256_storeu_ps(out + r * kLanes + 8 * (h0 + h), acc[r][h]);
}

// q5/q6 at 8-bit activations, R rows from r0 (a wide step's pass): one half of each tile at a time, its
// bytes q = low nibble | high bits << 4 rebuilt once for all R rows (8 registers), as q4_rows_half does for
// q4. Each row's 32-bit dots: vpmaddubsw pairs summed two at a time in 16 bits (2 x 2 x 63 x 128 < 2^15)
// before vpmaddwd; the same integers and float operations as hb_half (the same bits).
template <int HB, int G, bool S>
void hb_rows_half(const Activations& a, int64_t r0, int R, int64_t K, const uint8_t* w, float* out, int h) {
  static_assert(HB == 1 || HB == 2, "q5 or q6");
  constexpr Format f{HB, G, S};
  const int64_t nb = K / kGroup;
  const __m256i m4 = _mm256_set1_epi8(0x0F), m4h = _mm256_set1_epi8(static_cast<char>(0xF0));
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(out + r * kLanes + 8 * h, _mm256_setzero_ps());
  for (int64_t j = 0; j < nb; ++j) {
    const uint8_t* wb = w + j * f.bytes();
    if (h == 0) prefetch_ahead(wb, f.bytes());
    const uint8_t* sp = wb + kLowBytes + f.high_bytes();
    __m256i qa[4], qb[4];  // inputs 4v.. and 16 + 4v.. of the block
    for (int v = 0; v < 4; ++v) {
      const __m256i raw = LOADU(wb + 64 * v + 32 * h);
      const __m256i H = high_vec<HB>(wb + kLowBytes, v, h);
      qa[v] = _mm256_or_si256(_mm256_and_si256(raw, m4), _mm256_slli_epi16(_mm256_and_si256(H, m4), 4));
      qb[v] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw, 4), m4), _mm256_and_si256(H, m4h));
    }
    __m256 sc[G], bi[G];  // the half's scales and biases, once a tile for all rows
    for (int g = 0; g < G; ++g) {
      sc[g] = HALVES(sp + 32 * g + 16 * h);
      bi[g] = biases<S>(sp + 32 * G + 32 * g + 16 * h, sc[g], f);
    }
    const int8_t* x = a.lo.data() + r0 * K + j * kGroup;
    for (int r = 0; r < R; ++r, x += K) {
      __m256i p[2][2];  // [inputs 4v.. or 16 + 4v..][v < 2 or v >= 2]: two products a pair, in 16 bits
      for (int c = 0; c < 2; ++c) {
        const int v = 2 * c;
        p[0][c] = _mm256_add_epi16(_mm256_maddubs_epi16(qa[v], _mm256_set1_epi32(load4(x + 4 * v))),
                                   _mm256_maddubs_epi16(qa[v + 1], _mm256_set1_epi32(load4(x + 4 * v + 4))));
        p[1][c] = _mm256_add_epi16(_mm256_maddubs_epi16(qb[v], _mm256_set1_epi32(load4(x + 16 + 4 * v))),
                                   _mm256_maddubs_epi16(qb[v + 1], _mm256_set1_epi32(load4(x + 20 + 4 * v))));
      }
      __m256i dl[G];
      if constexpr (G == 1) {  // q5: one group
        dl[0] = _mm256_add_epi32(_mm256_add_epi32(pair_sums(p[0][0]), pair_sums(p[1][0])),
                                 _mm256_add_epi32(pair_sums(p[0][1]), pair_sums(p[1][1])));
      } else {  // q6: group 0 the block's first 16 inputs, group 1 the rest
        dl[0] = _mm256_add_epi32(pair_sums(p[0][0]), pair_sums(p[0][1]));
        dl[1] = _mm256_add_epi32(pair_sums(p[1][0]), pair_sums(p[1][1]));
      }
      const int64_t at = (r0 + r) * nb + j;
      const __m256 sx = _mm256_set1_ps(a.scale[at]);
      float* o = out + r * kLanes + 8 * h;
      __m256 acc = _mm256_loadu_ps(o);
      for (int g = 0; g < G; ++g) acc = _mm256_fmadd_ps(_mm256_mul_ps(sc[g], sx), _mm256_cvtepi32_ps(dl[g]), acc);
      for (int g = 0; g < G; ++g)
        acc = _mm256_fmadd_ps(bi[g], _mm256_set1_ps(G == 1 ? a.sum[at] : a.sum16[2 * at + g]), acc);
      _mm256_storeu_ps(o, acc);
    }
  }
}

// 16 ymm registers: passes of at most 4 rows (q4) or 2 (the others); a tile column's weights
// (K/32 tiles of 288-576 bytes) stay in L1/L2 between the passes
// q5/q6/q8: a pass of n <= 2 rows over NH halves from H0 (hb_half), by the format's high bits
template <bool S, bool W, int NH, int H0>
void hb_pass_of(const Activations& a, int64_t r0, int n, int64_t K, const uint8_t* w, Format f, float* o) {
  if (f.high_bits == 1) {
    n == 2 ? hb_half<1, 1, S, 2, W, NH>(a, r0, K, w, H0, o) : hb_half<1, 1, S, 1, W, NH>(a, r0, K, w, H0, o);
  } else if (f.high_bits == 2) {
    n == 2 ? hb_half<2, 2, S, 2, W, NH>(a, r0, K, w, H0, o) : hb_half<2, 2, S, 1, W, NH>(a, r0, K, w, H0, o);
  } else {
    n == 2 ? hb_half<4, 1, S, 2, W, NH>(a, r0, K, w, H0, o) : hb_half<4, 1, S, 1, W, NH>(a, r0, K, w, H0, o);
  }
}

template <bool W, int NH, int H0>
void hb_pass(const Activations& a, int64_t r0, int n, int64_t K, const uint8_t* w, Format f, float* o) {
  f.symmetric ? hb_pass_of<true, W, NH, H0>(a, r0, n, K, w, f, o) : hb_pass_of<false, W, NH, H0>(a, r0, n, K, w, f, o);
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

// Passes of at most 4 rows (q4) or 2 (the others), each over both halves of every tile: the column streams
// from memory once and the activations are broadcast once a pass (rows 1-4 gain, rows 8 the same:
// docs/cpu-kernels.md). With 16-bit activations the q5/q6/q8 passes of 2 rows would spill their 16
// accumulators, so a batch of more than 2 rows takes each half in its own pass there (slower by 5-15%
// with both).
template <bool W>
void avx2_tiles(const Activations& a, int64_t r0, int R, int64_t K, const uint8_t* w, Format f, float* out) {
  if (f.high_bits == 0) {
    if (f.kblocks) q4_passes<W, Q4::kBlocks>(a, r0, R, K, w, out);
    else if (f.symmetric) q4_passes<W, Q4::kSymmetric>(a, r0, R, K, w, out);
    else q4_passes<W, Q4::kStored>(a, r0, R, K, w, out);
    return;
  }
  if (!W && R >= kRowsHalfMin && f.high_bits != 4) {  // q5/q6, 8-bit rows: a half a pass (hb_rows_half)
    const auto half = f.high_bits == 1 ? (f.symmetric ? hb_rows_half<1, 1, true> : hb_rows_half<1, 1, false>)
                                       : (f.symmetric ? hb_rows_half<2, 2, true> : hb_rows_half<2, 2, false>);
    for (int h = 0; h < 2; ++h) half(a, r0, R, K, w, out, h);
    return;
  }
  if (!W || R <= 2) {
    for (int r = 0; r < R; r += 2) hb_pass<W, 2, 0>(a, r0 + r, std::min(R - r, 2), K, w, f, out + r * kLanes);
    return;
  }
  for (int h = 0; h < 2; ++h) {
    for (int r = 0; r < R; r += 2) {
      float* o = out + r * kLanes;
      h == 0 ? hb_pass<W, 1, 0>(a, r0 + r, std::min(R - r, 2), K, w, f, o)
             : hb_pass<W, 1, 1>(a, r0 + r, std::min(R - r, 2), K, w, f, o);
    }
  }
}

}  // namespace kvstrata_int_dot
#endif
