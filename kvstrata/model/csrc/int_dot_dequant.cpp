// Rows of a packed quantized weight (int_dot_common.h) as dense values: w = scale * q + bias per group,
// computed in float32 (one fma) and stored in out's dtype. Three uses (model/quant/): the embedding's rows
// for a step's tokens, the LM head's top candidates for exact rescoring, and a whole linear into a
// scratch buffer for a wide (prefill) step where no dense copy is kept. Registered as
// torch.ops.kvstrata.int_dot_dequant(packed, rows, out): rows [n] int64 output rows (empty = all N, in
// order), out [n, K] float32, bfloat16 or float16. With AVX2, a row's 32 values of a tile are four
// 4-byte words 64 bytes apart (one per vector v, int_dot_common.h): gathered, masked, widened to float
// and stored 8 at a time (~20x the portable loop, which gives the same values).
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <type_traits>

#include "int_dot_common.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define KVSTRATA_AVX2 1
#endif

namespace {

using namespace kvstrata_int_dot;

#if KVSTRATA_AVX2
// the words at w + offsets[v] + 4 i, v = 0..3, as 16 bytes (byte 4v + b: row i's byte b of vector v)
inline __m128i words(const uint8_t* w, int i, int o0, int o1, int o2, int o3) {
  return _mm_setr_epi32(load4(reinterpret_cast<const int8_t*>(w + o0 + 4 * i)),
                        load4(reinterpret_cast<const int8_t*>(w + o1 + 4 * i)),
                        load4(reinterpret_cast<const int8_t*>(w + o2 + 4 * i)),
                        load4(reinterpret_cast<const int8_t*>(w + o3 + 4 * i)));
}

template <typename scalar_t>
inline void store8(scalar_t* out, __m256 v) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    _mm256_storeu_ps(out, v);
  } else {
    alignas(32) float tmp[8];
    _mm256_store_ps(tmp, v);
    for (int t = 0; t < 8; ++t) out[t] = static_cast<scalar_t>(tmp[t]);
  }
}

// row i of the tile at wb: 32 values w = scale * q + bias (groups: 16 inputs a scale for q6)
template <typename scalar_t>
void dequant_tile_row(const uint8_t* col, int64_t j, Format f, int i, scalar_t* out) {
  const uint8_t* wb = tile_at(col, j, f);
  const __m128i m4 = _mm_set1_epi8(0x0F);
  const __m128i low = words(wb, i, 0, 64, 128, 192);
  __m128i qa = _mm_and_si128(low, m4), qb = _mm_and_si128(_mm_srli_epi16(low, 4), m4);  // inputs 0-15, 16-31
  if (f.high_bits) {
    const uint8_t* hp = wb + kLowBytes;
    __m128i H;
    if (f.high_bits == 4) {
      H = words(hp, i, 0, 64, 128, 192);
    } else if (f.high_bits == 2) {
      H = _mm_and_si128(_mm_srlv_epi32(words(hp, i, 0, 0, 64, 64), _mm_setr_epi32(0, 2, 0, 2)), _mm_set1_epi8(0x33));
    } else {
      H = _mm_and_si128(_mm_srlv_epi32(words(hp, i, 0, 0, 0, 0), _mm_setr_epi32(0, 1, 2, 3)), _mm_set1_epi8(0x11));
    }
    qa = _mm_or_si128(qa, _mm_slli_epi16(_mm_and_si128(H, m4), 4));
    qb = _mm_or_si128(qb, _mm_and_si128(H, _mm_set1_epi8(static_cast<char>(0xF0))));
  }
  const __m128i sides[2] = {qa, qb};
  for (int side = 0; side < 2; ++side) {
    float sg, bg;
    scale_bias(col, j, f, f.groups == 2 ? side : 0, i, sg, bg);
    const __m256 s = _mm256_set1_ps(sg), b = _mm256_set1_ps(bg);
    const __m256 lo8 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sides[side]));
    const __m256 hi8 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sides[side], 8)));
    store8(out + 16 * side, _mm256_fmadd_ps(s, lo8, b));
    store8(out + 16 * side + 8, _mm256_fmadd_ps(s, hi8, b));
  }
}
#endif

template <typename scalar_t>
void dequant_row(const uint8_t* base, Format f, int64_t K, int64_t n, scalar_t* out) {
  const int64_t nb = K / kGroup;
  const int i = static_cast<int>(n % kLanes);
  const uint8_t* tiles = base + (n / kLanes) * nb * f.bytes();
  for (int64_t j = 0; j < nb; ++j) {
    const uint8_t* wb = tile_at(tiles, j, f);
#if KVSTRATA_AVX2
    dequant_tile_row<scalar_t>(tiles, j, f, i, out + j * kGroup);
    continue;
#endif
    float s[2], b[2];
    for (int g = 0; g < f.groups; ++g) scale_bias(tiles, j, f, g, i, s[g], b[g]);
    for (int t = 0; t < kGroup; ++t) {
      const int g = f.groups == 2 ? t / 16 : 0;
      out[j * kGroup + t] = static_cast<scalar_t>(std::fma(s[g], static_cast<float>(tile_q(wb, f, i, t)), b[g]));
    }
  }
}

void int_dot_dequant(const at::Tensor& packed, const at::Tensor& rows, at::Tensor& out) {
  const Format f = format_of(packed);
  const int64_t N = packed.size(0) * kLanes, K = packed.size(1) * kGroup;
  TORCH_CHECK(rows.scalar_type() == at::kLong && rows.dim() == 1 && rows.is_contiguous(), "rows: int64 [n]");
  const int64_t n = rows.numel() ? rows.numel() : N;
  TORCH_CHECK(out.dim() == 2 && out.is_contiguous() && out.size(0) == n && out.size(1) == K,
              "out: a contiguous [", n, ", ", K, "] tensor");
  const int64_t* ids = rows.numel() ? rows.data_ptr<int64_t>() : nullptr;
  for (int64_t r = 0; ids && r < n; ++r)
    TORCH_CHECK(ids[r] >= 0 && ids[r] < N, "rows: ", ids[r], " is outside the weight's ", N, " rows");
  const uint8_t* base = packed.data_ptr<uint8_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, out.scalar_type(), "int_dot_dequant", [&] {
    scalar_t* o = out.data_ptr<scalar_t>();
    at::parallel_for(0, n, 16, [&](int64_t first, int64_t last) {
      for (int64_t r = first; r < last; ++r) dequant_row<scalar_t>(base, f, K, ids ? ids[r] : r, o + r * K);
    });
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kvstrata, m) {
  m.def("int_dot_dequant(Tensor packed, Tensor rows, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(kvstrata, CPU, m) {
  m.impl("int_dot_dequant", &int_dot_dequant);
}
