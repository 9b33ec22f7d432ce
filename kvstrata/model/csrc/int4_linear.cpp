// The GGUF's 4-bit linears for a few rows (decode steps) on VNNI dot products: activations quantized
// per block of 32 to 16-bit integers, split into two signed bytes (x16 = 256 hi + lo), each block's
// integer dot product with the weights' 4-bit values by vpdpbusd (u8 weights x s8 activations, four
// products a lane; two of them, hi and lo, per group of four inputs), then
//   y[n] = sum_j  scale[n, j] * sx[j] * idot(x16_j, q[n, j])  +  bias[n, j] * xsum[j]
// where w = scale * q + bias over block j (bias = zero - 8 scale, q4_weights.py's form) and xsum is
// the block's float sum of x. llama.cpp quantizes activations to 8 bits (Q8); that cost SmolLM2's
// greedy output (5 of 24 prompts equal to float32's over 32 tokens, against 18 with torch's kernel on
// bf16 activations). 16 bits cost little at one row, where the weight reads bound the step, and ~30%
// at eight (11.8 vs 8.9 ms for a step's 120 linears on the Zen 4 EPYC). torch's
// `_weight_int4pack_mm_for_cpu` (bf16 activations) took 4.2 ms at one row and 13.1 ms at eight there.
// Layout (q4_weights.py packs it): blocks of 16 output rows; per (block of rows, k-block j) four
// 64-byte vectors, lane i = row i, byte b of vector v holding q[k = 32j + 4v + b] in its low nibble
// and q[k = 32j + 16 + 4v + b] in its high one, so one load and a mask or a shift give vpdpbusd
// its operand for 16 rows; then the 16 rows' scales and biases as float16 (exact: the GGUF's own d and
// m). 320 bytes a (row block, k-block), read as one stream (the step is bound by it). On AVX2 (no VNNI)
// each vpdpbusd becomes vpmaddubsw (u8 x s8, pairs summed in 16 bits) and one vpmaddwd by ones per
// eight of them (8 x 2 x 15 x 128 < 2^15: no saturation), 8 rows a ymm half: the same integers, then
// the same float operations in the same order, so the same bits as on VNNI. Portable loops with the
// same integers elsewhere (for the tests; the model picks this op only where one of the two vector
// forms is built, cpu_kernels.int_dot_simd). Registered as torch.ops.kvstrata.int4_linear.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#if defined(__AVX512VNNI__) && defined(__AVX512F__)
#include <immintrin.h>
#define KVSTRATA_VNNI 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define KVSTRATA_AVX2 1
#endif

namespace {

constexpr int kLanes = 16;   // output rows per packed block
constexpr int kGroup = 32;   // k per quantization block (the GGUF's)
constexpr int kMaxRows = 8;  // activation rows per pass
constexpr int kWeightBytes = 4 * 64;  // one (row block, k-block): 4 vectors of 64 bytes of 4-bit pairs,
constexpr int kBlockBytes = kWeightBytes + 2 * 2 * kLanes;  // then 16 float16 scales and 16 float16 biases

constexpr float kMax16 = 127 * 256 + 127;  // |x16| bound: both of its bytes stay in -128..127

struct Activations {  // x quantized per row and k-block: x = scale * (256 hi + lo)
  std::vector<int8_t> hi, lo;  // [rows, K]
  std::vector<float> scale, sum;  // [rows, K / 32]
};

template <typename scalar_t>
Activations quantize(const scalar_t* x, int64_t rows, int64_t K) {
  const int64_t nb = K / kGroup;
  Activations a{std::vector<int8_t>(rows * K), std::vector<int8_t>(rows * K), std::vector<float>(rows * nb),
                std::vector<float>(rows * nb)};
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < nb; ++j) {
      const scalar_t* xb = x + r * K + j * kGroup;
      float amax = 0.f, sum = 0.f;
      for (int t = 0; t < kGroup; ++t) {
        const float v = static_cast<float>(xb[t]);
        amax = std::max(amax, std::fabs(v));
        sum += v;
      }
      const float s = amax > 0.f ? amax / kMax16 : 1.f;
      a.scale[r * nb + j] = s;
      a.sum[r * nb + j] = sum;
      for (int t = 0; t < kGroup; ++t) {
        const int x16 = static_cast<int>(std::clamp(std::nearbyint(static_cast<float>(xb[t]) / s), -kMax16, kMax16));
        const int hi = (x16 + 128) >> 8;  // floor: lo = x16 - 256 hi in -128..127
        a.hi[r * K + j * kGroup + t] = static_cast<int8_t>(hi);
        a.lo[r * K + j * kGroup + t] = static_cast<int8_t>(x16 - 256 * hi);
      }
    }
  }
  return a;
}

#if KVSTRATA_AVX2
// out[r][8 h + i] for N <= 4 rows from r0 and half h (output rows 8h..8h+7) of one block of 16
template <int N>
void half_rows(const Activations& a, int64_t r0, int64_t K, const uint8_t* w, int h, float* out /* [N][16] */) {
  const int64_t nb = K / kGroup;
  __m256 acc[N];
  for (int r = 0; r < N; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i mask = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  for (int64_t j = 0; j < nb; ++j) {
    const uint8_t* wb = w + j * kBlockBytes;
    __m256i lo[4], hi[4];
    for (int v = 0; v < 4; ++v) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 64 * v + 32 * h));
      lo[v] = _mm256_and_si256(raw, mask);
      hi[v] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
    }
    const __m256 sc = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + kWeightBytes + 16 * h)));
    const __m256 bi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + kWeightBytes + 32 + 16 * h)));
    for (int r = 0; r < N; ++r) {
      const int32_t* xh = reinterpret_cast<const int32_t*>(a.hi.data() + (r0 + r) * K + j * kGroup);
      const int32_t* xl = reinterpret_cast<const int32_t*>(a.lo.data() + (r0 + r) * K + j * kGroup);
      __m256i sh = _mm256_setzero_si256(), sl = _mm256_setzero_si256();  // 16-bit pair sums
      for (int v = 0; v < 4; ++v) {
        sh = _mm256_add_epi16(sh, _mm256_maddubs_epi16(lo[v], _mm256_set1_epi32(xh[v])));
        sh = _mm256_add_epi16(sh, _mm256_maddubs_epi16(hi[v], _mm256_set1_epi32(xh[4 + v])));
        sl = _mm256_add_epi16(sl, _mm256_maddubs_epi16(lo[v], _mm256_set1_epi32(xl[v])));
        sl = _mm256_add_epi16(sl, _mm256_maddubs_epi16(hi[v], _mm256_set1_epi32(xl[4 + v])));
      }
      const __m256i dot = _mm256_add_epi32(_mm256_slli_epi32(_mm256_madd_epi16(sh, ones), 8), _mm256_madd_epi16(sl, ones));
      const float sx = a.scale[(r0 + r) * nb + j], xs = a.sum[(r0 + r) * nb + j];
      acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(sc, _mm256_set1_ps(sx)), _mm256_cvtepi32_ps(dot), acc[r]);
      acc[r] = _mm256_fmadd_ps(bi, _mm256_set1_ps(xs), acc[r]);
    }
  }
  for (int r = 0; r < N; ++r) _mm256_storeu_ps(out + r * kLanes + 8 * h, acc[r]);
}
#endif

// out[r][i] for R rows and one block of 16 output rows
template <int R>
void row_block(const Activations& a, int64_t r0, int64_t K, const uint8_t* w, float* out /* [R][16] */) {
  const int64_t nb = K / kGroup;
#if KVSTRATA_VNNI
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i mask = _mm512_set1_epi8(0x0F);
  for (int64_t j = 0; j < nb; ++j) {
    const uint8_t* wb = w + j * kBlockBytes;
    __m512i lo[4], hi[4];
    for (int v = 0; v < 4; ++v) {
      const __m512i raw = _mm512_loadu_si512(wb + 64 * v);
      lo[v] = _mm512_and_si512(raw, mask);
      hi[v] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), mask);
    }
    const __m512 sc = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + kWeightBytes)));
    const __m512 bi = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + kWeightBytes + 32)));
    for (int r = 0; r < R; ++r) {
      const int32_t* xh = reinterpret_cast<const int32_t*>(a.hi.data() + (r0 + r) * K + j * kGroup);
      const int32_t* xl = reinterpret_cast<const int32_t*>(a.lo.data() + (r0 + r) * K + j * kGroup);
      __m512i dh = _mm512_setzero_si512(), dl = _mm512_setzero_si512();
      for (int v = 0; v < 4; ++v) {  // lo[v]: inputs 4v..4v+3 of the block, hi[v]: 16 + 4v..
        dh = _mm512_dpbusd_epi32(dh, lo[v], _mm512_set1_epi32(xh[v]));
        dh = _mm512_dpbusd_epi32(dh, hi[v], _mm512_set1_epi32(xh[4 + v]));
        dl = _mm512_dpbusd_epi32(dl, lo[v], _mm512_set1_epi32(xl[v]));
        dl = _mm512_dpbusd_epi32(dl, hi[v], _mm512_set1_epi32(xl[4 + v]));
      }
      const __m512i dot = _mm512_add_epi32(_mm512_slli_epi32(dh, 8), dl);
      const float sx = a.scale[(r0 + r) * nb + j], xs = a.sum[(r0 + r) * nb + j];
      acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(sc, _mm512_set1_ps(sx)), _mm512_cvtepi32_ps(dot), acc[r]);
      acc[r] = _mm512_fmadd_ps(bi, _mm512_set1_ps(xs), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + r * kLanes, acc[r]);
#elif KVSTRATA_AVX2
  // 16 ymm registers: a half's 8 weight vectors, up to 4 rows' accumulators, and temporaries; the
  // block's weights (K/32 x 320 bytes, <= 15 KB here) stay in L1 between the passes
  for (int h = 0; h < 2; ++h) {
    half_rows<(R < 4 ? R : 4)>(a, r0, K, w, h, out);
    if constexpr (R > 4) half_rows<R - 4>(a, r0 + 4, K, w, h, out + 4 * kLanes);
  }
#else
  for (int r = 0; r < R; ++r) {
    float acc[kLanes] = {};
    const int8_t* xh = a.hi.data() + (r0 + r) * K;
    const int8_t* xl = a.lo.data() + (r0 + r) * K;
    for (int64_t j = 0; j < nb; ++j) {
      const uint8_t* wb = w + j * kBlockBytes;
      const float sx = a.scale[(r0 + r) * nb + j], xs = a.sum[(r0 + r) * nb + j];
      const c10::Half* sc = reinterpret_cast<const c10::Half*>(wb + kWeightBytes);
      for (int i = 0; i < kLanes; ++i) {
        int32_t dot = 0;
        for (int v = 0; v < 4; ++v)
          for (int b = 0; b < 4; ++b) {
            const uint8_t byte = wb[64 * v + 4 * i + b];
            const int64_t k0 = j * kGroup + 4 * v + b, k1 = k0 + 16;
            dot += (byte & 0x0F) * (256 * xh[k0] + xl[k0]) + (byte >> 4) * (256 * xh[k1] + xl[k1]);
          }
        acc[i] = std::fma(static_cast<float>(sc[i]) * sx, static_cast<float>(dot), acc[i]);
        acc[i] = std::fma(static_cast<float>(sc[kLanes + i]), xs, acc[i]);
      }
    }
    std::copy(acc, acc + kLanes, out + r * kLanes);
  }
#endif
}

using BlockFn = void (*)(const Activations&, int64_t, int64_t, const uint8_t*, float*);
constexpr BlockFn kBlock[kMaxRows + 1] = {nullptr, row_block<1>, row_block<2>, row_block<3>, row_block<4>,
                                          row_block<5>, row_block<6>, row_block<7>, row_block<8>};

template <typename scalar_t>
void run(const at::Tensor& x, const uint8_t* w, int64_t blocks, at::Tensor& out) {
  const int64_t rows = x.size(0), K = x.size(1), N = blocks * kLanes;
  const Activations a = quantize<scalar_t>(x.data_ptr<scalar_t>(), rows, K);
  scalar_t* o = out.data_ptr<scalar_t>();
  at::parallel_for(0, blocks, 8, [&](int64_t first, int64_t last) {
    float tile[kMaxRows * kLanes];
    for (int64_t r0 = 0; r0 < rows; r0 += kMaxRows) {
      const int R = static_cast<int>(std::min<int64_t>(kMaxRows, rows - r0));
      for (int64_t nb = first; nb < last; ++nb) {
        kBlock[R](a, r0, K, w + nb * (K / kGroup) * kBlockBytes, tile);
        for (int r = 0; r < R; ++r)
          for (int i = 0; i < kLanes; ++i) o[(r0 + r) * N + nb * kLanes + i] = static_cast<scalar_t>(tile[r * kLanes + i]);
      }
    }
  });
}

at::Tensor int4_linear(const at::Tensor& x, const at::Tensor& packed) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "x: a contiguous [rows, in_features] tensor");
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() && packed.dim() == 3 &&
              packed.size(2) == kBlockBytes, "packed: uint8 [N / 16, K / 32, ", kBlockBytes, "]");
  TORCH_CHECK(packed.size(1) * kGroup == x.size(1), "packed holds in_features ", packed.size(1) * kGroup, ", x has ", x.size(1));
  auto out = at::empty({x.size(0), packed.size(0) * kLanes}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "int4_linear", [&] {
    run<scalar_t>(x, packed.data_ptr<uint8_t>(), packed.size(0), out);
  });
  return out;
}

// which of the three forms this build runs (int8_head.cpp is built with the same flags): for logs and tests
std::string int_dot_isa() {
#if KVSTRATA_VNNI
  return "avx512_vnni";
#elif KVSTRATA_AVX2
  return "avx2";
#else
  return "portable";
#endif
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kvstrata, m) {
  m.def("int4_linear(Tensor x, Tensor packed) -> Tensor");
  m.def("int_dot_isa() -> str", &int_dot_isa);
}

TORCH_LIBRARY_IMPL(kvstrata, CPU, m) {
  m.impl("int4_linear", &int4_linear);
}
