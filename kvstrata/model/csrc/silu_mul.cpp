// The MLP's activation, silu(gate) * up, as one op over the fused gate/up GEMM's output [rows, 2I]:
// torch spends three passes (chunk views, silu, mul) and two roundings to the dtype on it, ~7% of a
// bf16 prefill; here one pass in float32 and one rounding. So results can differ from the torch path
// in the last bit: the model uses it only where it is not bound to match transformers token for
// token (kvstrata/model/llama.py), like the norms. Registered as torch.ops.kvstrata.silu_mul.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <type_traits>

#include "exp_approx.h"

namespace {

inline float silu_times(float x, float u) {
  const float e = kvstrata::exp_nonpositive(-std::fabs(x));  // exp(-|x|): no overflow either side
  return x * (x >= 0.f ? 1.f / (1.f + e) : e / (1.f + e)) * u;
}

#if defined(__AVX512F__)
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::BFloat16* p) {  // bf16 -> float: the high half of the bits
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
inline void store16(c10::BFloat16* p, __m512 v) {  // float -> bf16, round to nearest even
  const __m512i b = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
}

template <typename scalar_t>
int64_t silu_mul_vec(const scalar_t* g, const scalar_t* u, scalar_t* o, int64_t n) {
  int64_t i = 0;
  if constexpr (std::is_same_v<scalar_t, float> || std::is_same_v<scalar_t, c10::BFloat16>) {
    const __m512 one = _mm512_set1_ps(1.f);
    for (; i + 16 <= n; i += 16) {
      const __m512 x = load16(g + i);
      const __m512 e = kvstrata::exp_nonpositive(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(x)));
      const __mmask16 neg = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
      const __m512 sig = _mm512_div_ps(_mm512_mask_blend_ps(neg, one, e), _mm512_add_ps(one, e));
      store16(o + i, _mm512_mul_ps(_mm512_mul_ps(x, sig), load16(u + i)));
    }
  }
  return i;  // elements done
}
#elif defined(__AVX2__) && defined(__FMA__)
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::BFloat16* p) {  // bf16 -> float: the high half of the bits
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
inline void store8(c10::BFloat16* p, __m256 v) {  // float -> bf16, round to nearest even (as the AVX-512 form)
  const __m256i b = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}

// the AVX-512 form's operations, 8 lanes at a time (AVX2 CPUs), so the same bits
template <typename scalar_t>
int64_t silu_mul_vec(const scalar_t* g, const scalar_t* u, scalar_t* o, int64_t n) {
  int64_t i = 0;
  if constexpr (std::is_same_v<scalar_t, float> || std::is_same_v<scalar_t, c10::BFloat16>) {
    const __m256 one = _mm256_set1_ps(1.f), zero = _mm256_setzero_ps(), sign = _mm256_set1_ps(-0.f);
    for (; i + 8 <= n; i += 8) {
      const __m256 x = load8(g + i);
      const __m256 e = kvstrata::exp_nonpositive(_mm256_sub_ps(zero, _mm256_andnot_ps(sign, x)));
      const __m256 neg = _mm256_cmp_ps(x, zero, _CMP_LT_OQ);
      const __m256 sig = _mm256_div_ps(_mm256_blendv_ps(one, e, neg), _mm256_add_ps(one, e));
      store8(o + i, _mm256_mul_ps(_mm256_mul_ps(x, sig), load8(u + i)));
    }
  }
  return i;  // elements done
}
#else
template <typename scalar_t>
int64_t silu_mul_vec(const scalar_t*, const scalar_t*, scalar_t*, int64_t) { return 0; }
#endif

template <typename scalar_t>
void silu_mul_rows(const scalar_t* gate_up, scalar_t* out, int64_t rows, int64_t inter) {
  // ~32k outputs a task: a decode step's few rows stay on one thread, a prefill's spread over all
  at::parallel_for(0, rows, std::max<int64_t>(1, 32768 / inter), [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const scalar_t* g = gate_up + r * 2 * inter;
      const scalar_t* u = g + inter;
      scalar_t* o = out + r * inter;
      for (int64_t i = silu_mul_vec(g, u, o, inter); i < inter; ++i)
        o[i] = static_cast<scalar_t>(silu_times(static_cast<float>(g[i]), static_cast<float>(u[i])));
    }
  });
}

at::Tensor silu_mul(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.is_contiguous() && gate_up.size(1) % 2 == 0,
              "gate_up: a contiguous [rows, 2 * intermediate] tensor");
  const int64_t rows = gate_up.size(0), inter = gate_up.size(1) / 2;
  auto out = at::empty({rows, inter}, gate_up.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gate_up.scalar_type(), "silu_mul", [&] {
    silu_mul_rows<scalar_t>(gate_up.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), rows, inter);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kvstrata, m) {
  m.def("silu_mul(Tensor gate_up) -> Tensor");
}

TORCH_LIBRARY_IMPL(kvstrata, CPU, m) {
  m.impl("silu_mul", &silu_mul);
}
