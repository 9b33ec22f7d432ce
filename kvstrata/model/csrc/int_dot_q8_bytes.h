// The AVX2 form of q8 tiles (Q8_0's q8s, and q8) at 8-bit activations for a batch of rows, beside
// int_dot_avx2_hb.h's hb_half (it uses their LOADU, HALVES, biases and prefetch: int_dot_avx2_common.h);
// int_dot_linear.cpp's run() and tiles() call it from kQ8SignedRows rows.
#pragma once

#include "int_dot_avx2_common.h"

#if KVSTRATA_AVX2
namespace kvstrata_int_dot {

// q8 at 8-bit activations for several rows (a decode batch, a verify step, a prefill on the integer
// kernels). hb_half keeps q's two nibble planes apart (a q8 byte times an activation byte can overflow
// vpmaddubsw's 16-bit pair sum): 4 vpmaddubsw and 5 more ops a row per 64 products, in passes of 2 rows.
// Here q becomes signed bytes w = q - 128, in registers by each pass of 4 rows or (many rows) once a call
// for the whole tile column (q8_column_bytes), and a row's products are llama.cpp's sign trick:
// vpmaddubsw(|w|, sign(x, w)) sums w * x in pairs (|w| <= 128, |x| <= 127: a pair <= 32,512, no
// saturation). idot(q, x) = idot(w, x) + 128 sum(x): the integer the planes give, so the float steps after
// it give hb_half's bits.
constexpr int64_t kQ8Bytes = 512;  // a rebuilt tile: per v and half h, 32 bytes of inputs 4v.., then 16 + 4v..
constexpr int kQ8Rows = 4;         // rows a q8_bytes pass (8 int32 accumulators; 2 rows a pass: 1.2x slower)

// the signed bytes of v, half h of tile wb: from the rebuilt column (wt: its tile) or from the planes
template <bool Built>
inline void q8_signed(const uint8_t* wb, const int8_t* wt, int v, int h, __m256i& wa, __m256i& wb2) {
  if constexpr (Built) {
    wa = LOADU(wt + 128 * v + 64 * h);
    wb2 = LOADU(wt + 128 * v + 64 * h + 32);
  } else {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m4h = _mm256_set1_epi8(static_cast<char>(0xF0));
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
    const __m256i raw = LOADU(wb + 64 * v + 32 * h), H = LOADU(wb + kLowBytes + 64 * v + 32 * h);
    wa = _mm256_xor_si256(_mm256_or_si256(_mm256_and_si256(raw, m4), _mm256_slli_epi16(_mm256_and_si256(H, m4), 4)), flip);
    wb2 = _mm256_xor_si256(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw, 4), m4), _mm256_and_si256(H, m4h)), flip);
  }
}

// the tile column at w rebuilt as signed bytes into out (kQ8Bytes a tile), for all the rows of a call
inline void q8_column_bytes(const uint8_t* w, int64_t nb, Format f, int8_t* out) {
  for (int64_t j = 0; j < nb; ++j) {
    int8_t* o = out + j * kQ8Bytes;
    for (int v = 0; v < 4; ++v) {
      for (int h = 0; h < 2; ++h) {
        __m256i wa, wb;
        q8_signed<false>(w + j * f.bytes(), nullptr, v, h, wa, wb);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 128 * v + 64 * h), wa);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 128 * v + 64 * h + 32), wb);
      }
    }
  }
}

// out[r][i] for N <= kQ8Rows rows from r0 of one q8 tile column (w: its tiles, for the scales; Built: wq is
// the column rebuilt by q8_column_bytes, else each pass rebuilds in registers); 8-bit activations only
template <int N, bool S, bool Built>
void q8_bytes_pass(const Activations& a, int64_t r0, int64_t K, const uint8_t* w, const int8_t* wq, float* out) {
  constexpr Format f{4, 1, S};
  const int64_t nb = K / kGroup;
  __m256 acc[N][2];
  for (int r = 0; r < N; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t j = 0; j < nb; ++j) {
    const uint8_t* tile = w + j * f.bytes();
    const int8_t* t = Built ? wq + j * kQ8Bytes : nullptr;
    if constexpr (!Built) prefetch_ahead(tile, f.bytes());
    __m256i d[N][2];
    for (int r = 0; r < N; ++r) d[r][0] = d[r][1] = _mm256_setzero_si256();
    for (int v = 0; v < 4; ++v) {
      for (int h = 0; h < 2; ++h) {
        __m256i wa, wb;
        q8_signed<Built>(tile, t, v, h, wa, wb);
        const __m256i aa = _mm256_abs_epi8(wa), ab = _mm256_abs_epi8(wb);
        for (int r = 0; r < N; ++r) {
          const int8_t* xl = a.lo.data() + (r0 + r) * K + j * kGroup;
          const __m256i la = _mm256_sign_epi8(_mm256_set1_epi32(load4(xl + 4 * v)), wa);
          const __m256i lb = _mm256_sign_epi8(_mm256_set1_epi32(load4(xl + 16 + 4 * v)), wb);
          d[r][h] = _mm256_add_epi32(d[r][h], _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(aa, la), ones),
                                                               _mm256_madd_epi16(_mm256_maddubs_epi16(ab, lb), ones)));
        }
      }
    }
    const uint8_t* sp = tile + kLowBytes + f.high_bytes();
    for (int r = 0; r < N; ++r) {
      const int64_t at = (r0 + r) * nb + j;
      const __m256 sx = _mm256_set1_ps(a.scale[at]);
      const __m256i zero_x = _mm256_set1_epi32(128 * a.isum[at]);
      for (int h = 0; h < 2; ++h) {
        const __m256 sc = HALVES(sp + 16 * h);
        acc[r][h] = _mm256_fmadd_ps(_mm256_mul_ps(sc, sx), _mm256_cvtepi32_ps(_mm256_add_epi32(d[r][h], zero_x)), acc[r][h]);
        acc[r][h] = _mm256_fmadd_ps(biases<S>(sp + 32 + 16 * h, sc, f), _mm256_set1_ps(a.sum[at]), acc[r][h]);
      }
    }
  }
  for (int r = 0; r < N; ++r)
    for (int h = 0; h < 2; ++h) _mm256_storeu_ps(out + r * kLanes + 8 * h, acc[r][h]);
}

// R rows from r0 of a q8 tile column in passes of kQ8Rows (Built: on wq, the column rebuilt; else in registers)
template <bool S, bool Built>
void q8_bytes_passes(const Activations& a, int64_t r0, int R, int64_t K, const uint8_t* w, const int8_t* wq, float* out) {
  for (int r = 0; r < R; r += kQ8Rows) {
    const int n = std::min(R - r, kQ8Rows);
    float* o = out + r * kLanes;
    if (n == 4) q8_bytes_pass<4, S, Built>(a, r0 + r, K, w, wq, o);
    else if (n == 3) q8_bytes_pass<3, S, Built>(a, r0 + r, K, w, wq, o);
    else if (n == 2) q8_bytes_pass<2, S, Built>(a, r0 + r, K, w, wq, o);
    else q8_bytes_pass<1, S, Built>(a, r0 + r, K, w, wq, o);
  }
}

}  // namespace kvstrata_int_dot
#endif
