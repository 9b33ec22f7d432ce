// A GGUF's quantized linears for a few rows (decode steps, the LM head) on integer dot products, read
// from their own blocks (layout: int_dot_common.h). Activations are quantized per block of 32 to 16-bit
// integers split into two signed bytes (x16 = 256 hi + lo), and
//   y[n] = sum_g  scale[n, g] * sx * idot(x16_g, q[n, g])  +  bias[n, g] * xsum_g
// over the weight's groups g (32 inputs; 16 for q6). llama.cpp quantizes activations to 8 bits; on
// SmolLM2 that cost greedy agreement with float32 (5 of 24 prompts over 32 tokens, against 18 with
// 16 bits). Every weight is read once per pass of rows. Several weights (the parts of a fused q/k/v or
// gate/up, each of its own type) run in one call on activations quantized once.
// Forms, chosen at build time from the compiler's target:
// - q4 with AVX512-VNNI: vpdpbusd (u8 weights x s8 activation bytes, four products a lane), 16 rows a zmm.
// - q4 with AVX2: vpmaddubsw (u8 x s8, pairs summed in 16 bits) and one vpmaddwd by ones per eight of
//   them (8 x 2 x 15 x 128 < 2^15: no saturation), 8 rows a ymm half: the same integers and then the
//   same float operations in the same order as on VNNI, so the same bits.
// - q5/q6/q8 with AVX2 (also on AVX-512 CPUs): q = low nibble | high bits << 4 rebuilt in registers
//   (q5/q6 at most 63: one vpmaddubsw pair sum <= 16128; q8 as two nibble planes, summed in 32 bits).
// - Portable loops with the same integers and float operations elsewhere, so every op and test runs
//   on every CPU; the model picks this op only where a vector form is built (cpu_kernels.int_dot_simd).
// Registered as torch.ops.kvstrata.int_dot_linear(x, parts).
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <string>

#include "int_dot_common.h"

#if defined(__AVX512VNNI__) && defined(__AVX512F__)
#define KVSTRATA_VNNI 1
#endif
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define KVSTRATA_AVX2 1
#endif
#if KVSTRATA_VNNI || KVSTRATA_AVX2
#include <immintrin.h>
#endif

namespace {

using namespace kvstrata_int_dot;

constexpr int kMaxRows = 8;  // activation rows per q4 pass

#if KVSTRATA_AVX2
#define LOADU(p) _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
#define HALVES(p) _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))

// q4: out[r][8 h + i] for N <= 4 rows from r0 and half h (output rows 8h..8h+7) of one tile column
template <int N>
void q4_half(const Activations& a, int64_t r0, int64_t K, const uint8_t* w, int h, float* out /* [N][16] */) {
  const int64_t nb = K / kGroup;
  __m256 acc[N];
  for (int r = 0; r < N; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i mask = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  for (int64_t j = 0; j < nb; ++j) {
    const uint8_t* wb = w + j * kQ4.bytes();
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
        sh = _mm256_add_epi16(sh, _mm256_maddubs_epi16(lo[v], _mm256_set1_epi32(load4(xh + 4 * v))));
        sh = _mm256_add_epi16(sh, _mm256_maddubs_epi16(hi[v], _mm256_set1_epi32(load4(xh + 16 + 4 * v))));
        sl = _mm256_add_epi16(sl, _mm256_maddubs_epi16(lo[v], _mm256_set1_epi32(load4(xl + 4 * v))));
        sl = _mm256_add_epi16(sl, _mm256_maddubs_epi16(hi[v], _mm256_set1_epi32(load4(xl + 16 + 4 * v))));
      }
      const __m256i dot = _mm256_add_epi32(_mm256_slli_epi32(_mm256_madd_epi16(sh, ones), 8), _mm256_madd_epi16(sl, ones));
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
template <int HB, int G, int N>
void hb_half(const Activations& a, int64_t r0, int64_t K, const uint8_t* w, int h, float* out /* [N][16] */) {
  constexpr Format f{HB, G};
  const int64_t nb = K / kGroup;
  __m256 acc[N];
  for (int r = 0; r < N; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0x0F), m4h = _mm256_set1_epi8(static_cast<char>(0xF0));
  for (int64_t j = 0; j < nb; ++j) {
    const uint8_t* wb = w + j * f.bytes();
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
          const __m256i th = _mm256_add_epi16(_mm256_maddubs_epi16(qa, ha), _mm256_maddubs_epi16(qb, hb));
          const __m256i tl = _mm256_add_epi16(_mm256_maddubs_epi16(qa, la), _mm256_maddubs_epi16(qb, lb));
          const __m256i sh = _mm256_add_epi16(_mm256_maddubs_epi16(lo, ha), _mm256_maddubs_epi16(hi, hb));
          const __m256i sl = _mm256_add_epi16(_mm256_maddubs_epi16(lo, la), _mm256_maddubs_epi16(hi, lb));
          dh[r][0] = _mm256_add_epi32(dh[r][0], _mm256_add_epi32(pair_sums(sh), _mm256_slli_epi32(pair_sums(th), 4)));
          dl[r][0] = _mm256_add_epi32(dl[r][0], _mm256_add_epi32(pair_sums(sl), _mm256_slli_epi32(pair_sums(tl), 4)));
        } else {  // q up to 63: one byte, one product pair <= 2 x 63 x 128
          const __m256i qa = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(H, m4), 4));
          const __m256i qb = _mm256_or_si256(hi, _mm256_and_si256(H, m4h));
          const __m256i pha = _mm256_maddubs_epi16(qa, ha), phb = _mm256_maddubs_epi16(qb, hb);
          const __m256i pla = _mm256_maddubs_epi16(qa, la), plb = _mm256_maddubs_epi16(qb, lb);
          if constexpr (G == 1) {
            dh[r][0] = _mm256_add_epi32(dh[r][0], pair_sums(_mm256_add_epi16(pha, phb)));
            dl[r][0] = _mm256_add_epi32(dl[r][0], pair_sums(_mm256_add_epi16(pla, plb)));
          } else {
            dh[r][0] = _mm256_add_epi32(dh[r][0], pair_sums(pha));
            dh[r][G - 1] = _mm256_add_epi32(dh[r][G - 1], pair_sums(phb));
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
        const __m256i dot = _mm256_add_epi32(_mm256_slli_epi32(dh[r][g], 8), dl[r][g]);
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
#endif

// Portable: out[r][i] for R rows and one tile column, any format (the same integers and float operations)
void portable_tiles(const Activations& a, int64_t r0, int R, int64_t K, const uint8_t* w, Format f, float* out) {
  const int64_t nb = K / kGroup;
  const int G = f.groups;
  for (int r = 0; r < R; ++r) {
    float acc[kLanes] = {};
    const int8_t* xh = a.hi.data() + (r0 + r) * K;
    const int8_t* xl = a.lo.data() + (r0 + r) * K;
    for (int64_t j = 0; j < nb; ++j) {
      const uint8_t* wb = w + j * f.bytes();
      const c10::Half* sc = reinterpret_cast<const c10::Half*>(wb + kLowBytes + f.high_bytes());
      const int64_t at = (r0 + r) * nb + j;
      for (int i = 0; i < kLanes; ++i) {
        int32_t dot[2] = {0, 0};
        for (int t = 0; t < kGroup; ++t) {
          const int64_t k = j * kGroup + t;
          dot[G == 2 ? t / 16 : 0] += tile_q(wb, f, i, t) * (256 * xh[k] + xl[k]);
        }
        for (int g = 0; g < G; ++g)
          acc[i] = std::fma(static_cast<float>(sc[kLanes * g + i]) * a.scale[at], static_cast<float>(dot[g]), acc[i]);
        for (int g = 0; g < G; ++g)
          acc[i] = std::fma(static_cast<float>(sc[kLanes * (G + g) + i]), G == 1 ? a.sum[at] : a.sum16[2 * at + g], acc[i]);
      }
    }
    std::copy(acc, acc + kLanes, out + r * kLanes);
  }
}

// out[r][i] for rows r0..r0+R-1 (R <= 8) of one tile column of a weight in format f
void tiles(const Activations& a, int64_t r0, int R, int64_t K, const uint8_t* w, Format f, float* out) {
#if KVSTRATA_VNNI
  if (f.high_bits == 0) {
    const int64_t nb = K / kGroup;
    const __m512i mask = _mm512_set1_epi8(0x0F);
    __m512 acc[kMaxRows];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t j = 0; j < nb; ++j) {
      const uint8_t* wb = w + j * kQ4.bytes();
      __m512i lo[4], hi[4];
      for (int v = 0; v < 4; ++v) {
        const __m512i raw = _mm512_loadu_si512(wb + 64 * v);
        lo[v] = _mm512_and_si512(raw, mask);
        hi[v] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), mask);
      }
      const __m512 sc = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + kLowBytes)));
      const __m512 bi = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + kLowBytes + 32)));
      for (int r = 0; r < R; ++r) {
        const int8_t* xh = a.hi.data() + (r0 + r) * K + j * kGroup;
        const int8_t* xl = a.lo.data() + (r0 + r) * K + j * kGroup;
        __m512i dh = _mm512_setzero_si512(), dl = _mm512_setzero_si512();
        for (int v = 0; v < 4; ++v) {  // lo[v]: inputs 4v..4v+3 of the block, hi[v]: 16 + 4v..
          dh = _mm512_dpbusd_epi32(dh, lo[v], _mm512_set1_epi32(load4(xh + 4 * v)));
          dh = _mm512_dpbusd_epi32(dh, hi[v], _mm512_set1_epi32(load4(xh + 16 + 4 * v)));
          dl = _mm512_dpbusd_epi32(dl, lo[v], _mm512_set1_epi32(load4(xl + 4 * v)));
          dl = _mm512_dpbusd_epi32(dl, hi[v], _mm512_set1_epi32(load4(xl + 16 + 4 * v)));
        }
        const __m512i dot = _mm512_add_epi32(_mm512_slli_epi32(dh, 8), dl);
        const float sx = a.scale[(r0 + r) * nb + j], xs = a.sum[(r0 + r) * nb + j];
        acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(sc, _mm512_set1_ps(sx)), _mm512_cvtepi32_ps(dot), acc[r]);
        acc[r] = _mm512_fmadd_ps(bi, _mm512_set1_ps(xs), acc[r]);
      }
    }
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + r * kLanes, acc[r]);
    return;
  }
#endif
#if KVSTRATA_AVX2
  // 16 ymm registers: passes of at most 4 rows (q4) or 2 (the others); a tile column's weights
  // (K/32 tiles of 320-576 bytes) stay in L1/L2 between the passes
  for (int h = 0; h < 2; ++h) {
    for (int r = 0; r < R;) {
      const int n = std::min(R - r, f.high_bits == 0 ? 4 : 2);
      float* o = out + r * kLanes;
      if (f.high_bits == 0) {
        if (n == 4) q4_half<4>(a, r0 + r, K, w, h, o);
        else if (n == 3) q4_half<3>(a, r0 + r, K, w, h, o);
        else if (n == 2) q4_half<2>(a, r0 + r, K, w, h, o);
        else q4_half<1>(a, r0 + r, K, w, h, o);
      } else if (f.high_bits == 1) {
        n == 2 ? hb_half<1, 1, 2>(a, r0 + r, K, w, h, o) : hb_half<1, 1, 1>(a, r0 + r, K, w, h, o);
      } else if (f.high_bits == 2) {
        n == 2 ? hb_half<2, 2, 2>(a, r0 + r, K, w, h, o) : hb_half<2, 2, 1>(a, r0 + r, K, w, h, o);
      } else {
        n == 2 ? hb_half<4, 1, 2>(a, r0 + r, K, w, h, o) : hb_half<4, 1, 1>(a, r0 + r, K, w, h, o);
      }
      r += n;
    }
  }
#else
  portable_tiles(a, r0, R, K, w, f, out);
#endif
}

template <typename scalar_t>
void run(const at::Tensor& x, const std::vector<at::Tensor>& parts, at::Tensor& out) {
  const int64_t rows = x.size(0), K = x.size(1), N = out.size(1);
  const Activations a = quantize<scalar_t>(x.data_ptr<scalar_t>(), rows, K);
  std::vector<int64_t> first_tile{0};  // tile columns of the parts, numbered across them
  std::vector<Format> formats;
  for (const at::Tensor& p : parts) {
    first_tile.push_back(first_tile.back() + p.size(0));
    formats.push_back(format_of(p));
  }
  scalar_t* o = out.data_ptr<scalar_t>();
  at::parallel_for(0, first_tile.back(), 8, [&](int64_t first, int64_t last) {
    float tile[kMaxRows * kLanes];
    for (int64_t c = first; c < last; ++c) {
      const size_t p = std::upper_bound(first_tile.begin(), first_tile.end(), c) - first_tile.begin() - 1;
      const Format f = formats[p];
      const uint8_t* w = parts[p].data_ptr<uint8_t>() + (c - first_tile[p]) * (K / kGroup) * f.bytes();
      for (int64_t r0 = 0; r0 < rows; r0 += kMaxRows) {
        const int R = static_cast<int>(std::min<int64_t>(kMaxRows, rows - r0));
        tiles(a, r0, R, K, w, f, tile);
        for (int r = 0; r < R; ++r)
          for (int i = 0; i < kLanes; ++i) o[(r0 + r) * N + c * kLanes + i] = static_cast<scalar_t>(tile[r * kLanes + i]);
      }
    }
  });
}

at::Tensor int_dot_linear(const at::Tensor& x, at::TensorList parts) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "x: a contiguous [rows, in_features] tensor");
  TORCH_CHECK(!parts.empty(), "parts: at least one packed weight");
  std::vector<at::Tensor> kept;
  int64_t N = 0;
  for (const at::Tensor& p : parts) {
    format_of(p);
    TORCH_CHECK(p.size(1) * kGroup == x.size(1), "packed holds in_features ", p.size(1) * kGroup, ", x has ", x.size(1));
    N += p.size(0) * kLanes;
    kept.push_back(p);
  }
  auto out = at::empty({x.size(0), N}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "int_dot_linear", [&] {
    run<scalar_t>(x, kept, out);
  });
  return out;
}

// which form this build runs for q4 (int8_head.cpp is built with the same flags): for logs and tests
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
  m.def("int_dot_linear(Tensor x, Tensor[] parts) -> Tensor");
  m.def("int_dot_isa() -> str", &int_dot_isa);
}

TORCH_LIBRARY_IMPL(kvstrata, CPU, m) {
  m.impl("int_dot_linear", &int_dot_linear);
}
