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

// The tile kPrefetch tiles on, into L1, while this one is computed (on the first half's pass: the second
// finds the column in L1). A tile column is contiguous and the next one follows it, so the hardware
// prefetchers would find the stream too, but late: at one row a step the kernel waited on memory (a 1B
// Q4_K_M decode step at batch 1 on the Zen 3 EPYC: 56.4 -> 50.9 ms, bench/step_profile.py --ab-act-bits).
inline void prefetch_ahead(const uint8_t* wb, int64_t tile_bytes) {
  const uint8_t* p = wb + kPrefetch * tile_bytes;
  for (int64_t l = 0; l < tile_bytes; l += 64) _mm_prefetch(reinterpret_cast<const char*>(p + l), _MM_HINT_T0);
}

// q4: out[r][8 h + i] for N <= 4 rows from r0 and half h (output rows 8h..8h+7) of one tile column
// (W: wide, 16-bit activations; else 8-bit ones, whose hi bytes are 0 and skipped)
template <int N, bool W>
void q4_half(const Activations& a, int64_t r0, int64_t K, const uint8_t* w, int h, float* out /* [N][16] */) {
  const int64_t nb = K / kGroup;
  __m256 acc[N];
  for (int r = 0; r < N; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i mask = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  for (int64_t j = 0; j < nb; ++j) {
    const uint8_t* wb = w + j * kQ4.bytes();
    if (h == 0) prefetch_ahead(wb, kQ4.bytes());
    __m256i lo[4], hi[4];
    for (int v = 0; v < 4; ++v) {
      const __m256i raw = LOADU(wb + 64 * v + 32 * h);
      lo[v] = _mm256_and_si256(raw, mask);
      hi[v] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
    }
    const __m256 sc = HALVES(wb + kLowBytes + 16 * h), bi = HALVES(wb + kLowBytes + 32 + 16 * h);
    for (int r = 0; r < N; ++r) {
      const int8_t* xh = a.hi.data() + (r0 + r) * K + j * kGroup;
      const int8_t* xl = a.lo.data() + (r0 + r) * K + j * kGroup;
      __m256i sh = _mm256_setzero_si256(), sl = _mm256_setzero_si256();  // 16-bit pair sums
      for (int v = 0; v < 4; ++v) {
        if constexpr (W) {
          sh = _mm256_add_epi16(sh, _mm256_maddubs_epi16(lo[v], _mm256_set1_epi32(load4(xh + 4 * v))));
          sh = _mm256_add_epi16(sh, _mm256_maddubs_epi16(hi[v], _mm256_set1_epi32(load4(xh + 16 + 4 * v))));
        }
        sl = _mm256_add_epi16(sl, _mm256_maddubs_epi16(lo[v], _mm256_set1_epi32(load4(xl + 4 * v))));
        sl = _mm256_add_epi16(sl, _mm256_maddubs_epi16(hi[v], _mm256_set1_epi32(load4(xl + 16 + 4 * v))));
      }
      __m256i dot = _mm256_madd_epi16(sl, ones);
      if constexpr (W) dot = _mm256_add_epi32(_mm256_slli_epi32(_mm256_madd_epi16(sh, ones), 8), dot);
      const float sx = a.scale[(r0 + r) * nb + j], xs = a.sum[(r0 + r) * nb + j];
      acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(sc, _mm256_set1_ps(sx)), _mm256_cvtepi32_ps(dot), acc[r]);
      acc[r] = _mm256_fmadd_ps(bi, _mm256_set1_ps(xs), acc[r]);
    }
  }
  for (int r = 0; r < N; ++r) _mm256_storeu_ps(out + r * kLanes + 8 * h, acc[r]);
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

// q5/q6/q8: out[r][8 h + i] for N <= 2 rows from r0, half h; F = the format's (high bits, groups)
template <int HB, int G, int N, bool W>
void hb_half(const Activations& a, int64_t r0, int64_t K, const uint8_t* w, int h, float* out /* [N][16] */) {
  constexpr Format f{HB, G};
  const int64_t nb = K / kGroup;
  __m256 acc[N];
  for (int r = 0; r < N; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0x0F), m4h = _mm256_set1_epi8(static_cast<char>(0xF0));
  for (int64_t j = 0; j < nb; ++j) {
    const uint8_t* wb = w + j * f.bytes();
    if (h == 0) prefetch_ahead(wb, f.bytes());
    const uint8_t* sp = wb + kLowBytes + f.high_bytes();
    __m256i dh[N][G], dl[N][G];  // 32-bit dots with the hi and lo activation bytes, per group
    for (int r = 0; r < N; ++r)
      for (int g = 0; g < G; ++g) dh[r][g] = dl[r][g] = _mm256_setzero_si256();
    for (int v = 0; v < 4; ++v) {
      const __m256i raw = LOADU(wb + 64 * v + 32 * h);
      const __m256i lo = _mm256_and_si256(raw, m4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
      const __m256i H = high_vec<HB>(wb + kLowBytes, v, h);
      for (int r = 0; r < N; ++r) {
        const int8_t* xh = a.hi.data() + (r0 + r) * K + j * kGroup;
        const int8_t* xl = a.lo.data() + (r0 + r) * K + j * kGroup;
        const __m256i ha = _mm256_set1_epi32(load4(xh + 4 * v)), hb = _mm256_set1_epi32(load4(xh + 16 + 4 * v));
        const __m256i la = _mm256_set1_epi32(load4(xl + 4 * v)), lb = _mm256_set1_epi32(load4(xl + 16 + 4 * v));
        if constexpr (HB == 4) {  // q up to 255: the nibble planes apart (each product pair <= 2 x 15 x 128)
          const __m256i qa = _mm256_and_si256(H, m4), qb = _mm256_and_si256(_mm256_srli_epi16(H, 4), m4);
          if constexpr (W) {
            const __m256i th = _mm256_add_epi16(_mm256_maddubs_epi16(qa, ha), _mm256_maddubs_epi16(qb, hb));
            const __m256i sh = _mm256_add_epi16(_mm256_maddubs_epi16(lo, ha), _mm256_maddubs_epi16(hi, hb));
            dh[r][0] = _mm256_add_epi32(dh[r][0], _mm256_add_epi32(pair_sums(sh), _mm256_slli_epi32(pair_sums(th), 4)));
          }
          const __m256i tl = _mm256_add_epi16(_mm256_maddubs_epi16(qa, la), _mm256_maddubs_epi16(qb, lb));
          const __m256i sl = _mm256_add_epi16(_mm256_maddubs_epi16(lo, la), _mm256_maddubs_epi16(hi, lb));
          dl[r][0] = _mm256_add_epi32(dl[r][0], _mm256_add_epi32(pair_sums(sl), _mm256_slli_epi32(pair_sums(tl), 4)));
        } else {  // q up to 63: one byte, one product pair <= 2 x 63 x 128
          const __m256i qa = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(H, m4), 4));
          const __m256i qb = _mm256_or_si256(hi, _mm256_and_si256(H, m4h));
          const __m256i pla = _mm256_maddubs_epi16(qa, la), plb = _mm256_maddubs_epi16(qb, lb);
          if constexpr (W) {
            const __m256i pha = _mm256_maddubs_epi16(qa, ha), phb = _mm256_maddubs_epi16(qb, hb);
            if constexpr (G == 1) {
              dh[r][0] = _mm256_add_epi32(dh[r][0], pair_sums(_mm256_add_epi16(pha, phb)));
            } else {
              dh[r][0] = _mm256_add_epi32(dh[r][0], pair_sums(pha));
              dh[r][G - 1] = _mm256_add_epi32(dh[r][G - 1], pair_sums(phb));
            }
          }
          if constexpr (G == 1) {
            dl[r][0] = _mm256_add_epi32(dl[r][0], pair_sums(_mm256_add_epi16(pla, plb)));
          } else {
            dl[r][0] = _mm256_add_epi32(dl[r][0], pair_sums(pla));
            dl[r][G - 1] = _mm256_add_epi32(dl[r][G - 1], pair_sums(plb));
          }
        }
      }
    }
    for (int r = 0; r < N; ++r) {
      const int64_t at = (r0 + r) * nb + j;
      const __m256 sx = _mm256_set1_ps(a.scale[at]);
      for (int g = 0; g < G; ++g) {
        const __m256i dot = W ? _mm256_add_epi32(_mm256_slli_epi32(dh[r][g], 8), dl[r][g]) : dl[r][g];
        acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(HALVES(sp + 32 * g + 16 * h), sx), _mm256_cvtepi32_ps(dot), acc[r]);
      }
      for (int g = 0; g < G; ++g) {
        const float xs = G == 1 ? a.sum[at] : a.sum16[2 * at + g];
        acc[r] = _mm256_fmadd_ps(HALVES(sp + 32 * G + 32 * g + 16 * h), _mm256_set1_ps(xs), acc[r]);
      }
    }
  }
  for (int r = 0; r < N; ++r) _mm256_storeu_ps(out + r * kLanes + 8 * h, acc[r]);
}

// 16 ymm registers: passes of at most 4 rows (q4) or 2 (the others); a tile column's weights
// (K/32 tiles of 320-576 bytes) stay in L1/L2 between the passes
template <bool W>
void avx2_tiles(const Activations& a, int64_t r0, int R, int64_t K, const uint8_t* w, Format f, float* out) {
  for (int h = 0; h < 2; ++h) {
    for (int r = 0; r < R;) {
      const int n = std::min(R - r, f.high_bits == 0 ? 4 : 2);
      float* o = out + r * kLanes;
      if (f.high_bits == 0) {
        if (n == 4) q4_half<4, W>(a, r0 + r, K, w, h, o);
        else if (n == 3) q4_half<3, W>(a, r0 + r, K, w, h, o);
        else if (n == 2) q4_half<2, W>(a, r0 + r, K, w, h, o);
        else q4_half<1, W>(a, r0 + r, K, w, h, o);
      } else if (f.high_bits == 1) {
        n == 2 ? hb_half<1, 1, 2, W>(a, r0 + r, K, w, h, o) : hb_half<1, 1, 1, W>(a, r0 + r, K, w, h, o);
      } else if (f.high_bits == 2) {
        n == 2 ? hb_half<2, 2, 2, W>(a, r0 + r, K, w, h, o) : hb_half<2, 2, 1, W>(a, r0 + r, K, w, h, o);
      } else {
        n == 2 ? hb_half<4, 1, 2, W>(a, r0 + r, K, w, h, o) : hb_half<4, 1, 1, W>(a, r0 + r, K, w, h, o);
      }
      r += n;
    }
  }
}

}  // namespace kvstrata_int_dot
#endif
