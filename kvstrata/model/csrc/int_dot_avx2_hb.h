// The AVX2 tile loops of q5, q6 and q8 (int_dot_avx2.h; also run on AVX-512 CPUs): the formats with high
// bits, q = low nibble | high bits << 4 rebuilt in registers (q5/q6: q <= 63, one byte; q8: its two nibble
// planes kept apart), in halves of 8 output rows a ymm; passes of up to 2 rows (hb_half), or for q5/q6 at
// 8-bit activations in a wide step one half at a time for all its rows (hb_rows_half).
#pragma once

#include "int_dot_avx2_common.h"

#if KVSTRATA_AVX2
namespace kvstrata_int_dot {

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

}  // namespace kvstrata_int_dot
#endif
