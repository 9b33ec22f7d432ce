// paged_prefill.cpp's tiles on AVX512-BF16 (vdpbf16ps): the score and P V tiles over the packed K/V pairs and
// the online softmax of a row's block of scores. paged_prefill_portable.h has the same tiles for other CPUs.
// Included inside paged_prefill.cpp's anonymous namespace, after kBk and kNegInf, where KVSTRATA_AVX512BF16.
#pragma once

using kvstrata::exp_nonpositive;

inline __m512bh as_bh(__m512i x) { return (__m512bh)x; }

// S[r][0..63] = q_r . Kp block for R rows; q32[r] = row r's D/2 bf16 pairs
template <int D, int R>
inline void score_tile(const uint32_t* const* q32, const uint32_t* kp, float scale, float* s) {
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int p = 0; p < D / 2; ++p) {
    __m512i k[4];
    for (int c = 0; c < 4; ++c) k[c] = _mm512_loadu_si512(kp + p * kBk + 16 * c);
    for (int r = 0; r < R; ++r) {
      const __m512i qb = _mm512_set1_epi32(static_cast<int>(q32[r][p]));
      for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], as_bh(qb), as_bh(k[c]));
    }
  }
  const __m512 sc = _mm512_set1_ps(scale);
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) _mm512_storeu_ps(s + r * kBk + 16 * c, _mm512_mul_ps(acc[r][c], sc));
}

// O[r] = O[r] * alpha[r] + P[r] . Vp block for R rows; p32[r] = row r's kBk/2 bf16 pairs
template <int D, int R>
inline void pv_tile(const uint32_t* p32, const uint32_t* vp, const float* alpha, float* o) {
  constexpr int NV = D / 16;
  __m512 acc[R][NV];
  for (int r = 0; r < R; ++r) {
    const __m512 a = _mm512_set1_ps(alpha[r]);
    for (int c = 0; c < NV; ++c) acc[r][c] = _mm512_mul_ps(_mm512_loadu_ps(o + r * D + 16 * c), a);
  }
  for (int jp = 0; jp < kBk / 2; ++jp) {
    __m512i v[NV];
    for (int c = 0; c < NV; ++c) v[c] = _mm512_loadu_si512(vp + jp * D + 16 * c);
    for (int r = 0; r < R; ++r) {
      const __m512i pb = _mm512_set1_epi32(static_cast<int>(p32[r * (kBk / 2) + jp]));
      for (int c = 0; c < NV; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], as_bh(pb), as_bh(v[c]));
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NV; ++c) _mm512_storeu_ps(o + r * D + 16 * c, acc[r][c]);
}

// one row's block of scores sr[kBk] (-inf where masked) into the online softmax: m (running max), l16
// (the running sum, kept as 16 lane sums so no block pays a horizontal add) and alpha (the factor for
// the row's earlier output) updated, P as bf16 pairs in pr
inline void softmax_block(float* sr, float& m, float* l16, float& alpha, uint32_t* pr) {
  __m512 v[4];
  __m512 mx = _mm512_set1_ps(m);
  for (int c = 0; c < 4; ++c) {
    v[c] = _mm512_loadu_ps(sr + 16 * c);
    mx = _mm512_max_ps(mx, v[c]);
  }
  const float m_new = _mm512_reduce_max_ps(mx);
  if (m_new == kNegInf) {  // every token of this block is after the row's position
    alpha = 1.f;
    std::memset(pr, 0, (kBk / 2) * sizeof(uint32_t));
    return;
  }
  const __m512 mb = _mm512_set1_ps(m_new);
  for (int c = 0; c < 4; ++c) v[c] = exp_nonpositive(_mm512_sub_ps(v[c], mb));
  alpha = m == kNegInf ? 0.f : kvstrata::exp_nonpositive(m - m_new);
  const __m512 sum = _mm512_add_ps(_mm512_add_ps(v[0], v[1]), _mm512_add_ps(v[2], v[3]));
  _mm512_storeu_ps(l16, _mm512_fmadd_ps(_mm512_loadu_ps(l16), _mm512_set1_ps(alpha), sum));
  m = m_new;
  _mm512_storeu_si512(pr, (__m512i)_mm512_cvtne2ps_pbh(v[1], v[0]));
  _mm512_storeu_si512(pr + 16, (__m512i)_mm512_cvtne2ps_pbh(v[3], v[2]));
}

inline float lane_sum(const float* l16) { return _mm512_reduce_add_ps(_mm512_loadu_ps(l16)); }
