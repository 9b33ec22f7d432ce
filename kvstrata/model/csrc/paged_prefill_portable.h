// paged_prefill.cpp's tiles in portable code, for CPUs without AVX512-BF16: the same layouts, each bf16
// pair's two products added as vdpbf16ps adds them (odd element first), P rounded to nearest even.
// Included inside paged_prefill.cpp's anonymous namespace, after kBk and kNegInf.
#pragma once

inline float lo_bf16(uint32_t pair) { return c10::detail::f32_from_bits(static_cast<uint16_t>(pair & 0xffff)); }
inline float hi_bf16(uint32_t pair) { return c10::detail::f32_from_bits(static_cast<uint16_t>(pair >> 16)); }

inline float exp_or_zero(float x) { return x == kNegInf ? 0.f : kvstrata::exp_nonpositive(x); }

template <int D, int R>
inline void score_tile(const uint32_t* const* q32, const uint32_t* kp, float scale, float* s) {
  for (int r = 0; r < R; ++r) {
    float acc[kBk] = {};
    for (int p = 0; p < D / 2; ++p) {
      const float qh = hi_bf16(q32[r][p]), ql = lo_bf16(q32[r][p]);
#pragma omp simd
      for (int j = 0; j < kBk; ++j) acc[j] = std::fma(ql, lo_bf16(kp[p * kBk + j]), std::fma(qh, hi_bf16(kp[p * kBk + j]), acc[j]));
    }
    for (int j = 0; j < kBk; ++j) s[r * kBk + j] = acc[j] * scale;
  }
}

template <int D, int R>
inline void pv_tile(const uint32_t* p32, const uint32_t* vp, const float* alpha, float* o) {
  for (int r = 0; r < R; ++r) {
    float acc[D];
    for (int d = 0; d < D; ++d) acc[d] = o[r * D + d] * alpha[r];
    for (int jp = 0; jp < kBk / 2; ++jp) {
      const float ph = hi_bf16(p32[r * (kBk / 2) + jp]), pl = lo_bf16(p32[r * (kBk / 2) + jp]);
#pragma omp simd
      for (int d = 0; d < D; ++d) acc[d] = std::fma(pl, lo_bf16(vp[jp * D + d]), std::fma(ph, hi_bf16(vp[jp * D + d]), acc[d]));
    }
    for (int d = 0; d < D; ++d) o[r * D + d] = acc[d];
  }
}

inline void softmax_block(float* sr, float& m, float* l16, float& alpha, uint32_t* pr) {
  float m_new = m;
  for (int j = 0; j < kBk; ++j) m_new = std::max(m_new, sr[j]);
  if (m_new == kNegInf) {
    alpha = 1.f;
    std::memset(pr, 0, (kBk / 2) * sizeof(uint32_t));
    return;
  }
  float e[kBk];
  for (int j = 0; j < kBk; ++j) e[j] = exp_or_zero(sr[j] - m_new);
  for (int j = 0; j < kBk; j += 2)  // pairs, the even element low; rounded to nearest even, as vcvtne2ps2bf16
    pr[j / 2] = static_cast<uint32_t>(c10::BFloat16(e[j]).x) | static_cast<uint32_t>(c10::BFloat16(e[j + 1]).x) << 16;
  alpha = m == kNegInf ? 0.f : kvstrata::exp_nonpositive(m - m_new);
  for (int i = 0; i < 16; ++i) l16[i] = l16[i] * alpha + ((e[i] + e[16 + i]) + (e[32 + i] + e[48 + i]));
  m = m_new;
}

inline float lane_sum(const float* l16) {
  float sum = 0.f;
  for (int i = 0; i < 16; ++i) sum += l16[i];
  return sum;
}
