// The int8 LM head for a few rows (decode steps) on VNNI dot products (vpdpbusd: 64 u8 x s8 products
// an instruction, summed in groups of four into 16 int32 lanes).
//
// torch's `_weight_int8pack_mm` runs each row over the whole 49k x 576 head at bf16 precision, so
// its time grows with the rows although reading the 28 MB of weights once would bound it
// (docs/cpu-kernels.md). Here every weight is read once for all rows: activations are quantized per row to int8
// (symmetric, max |x| / 127, +128 to make them the unsigned operand) and each block of 16 output rows
// is held as [K/4][16][4] bytes, so one load feeds every row's lanes. logit = (sum - 128 * wsum[n]) *
// sx * sw[n]. The extra rounding of the activations is covered where it matters by int8_head.py's
// exact rescoring of each row's top candidates. On AVX2 (no VNNI) vpmaddubsw cannot take the +128
// operand (255 x 127 x 2 saturates 16 bits), so it multiplies |w| by x - 128 with w's sign
// (vpsignb; 2 x 127 x 127 fits), then vpmaddwd by ones: the sum without the offset, the same
// integer once the epilogue skips the correction, so the same logits as on VNNI. Portable loops
// (same integers, same result) elsewhere, so the op and its tests run on every CPU; the model picks
// this op only where a vector form is built (cpu_kernels.int_dot_simd). With AMX (amx_tiles.h), calls of
// kAmxMinRows rows or more take the dots on tiles: the packed blocks are already B tiles (16 rows of
// [16 outputs x 4 inputs]), the activations signed bytes (x, not x + 128: tdpbssd), and one int32 tile
// sums a block's whole K for 16 rows; the same integers, so the same logits. Registered as
// torch.ops.kvstrata.int8_head_logits.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "amx_tiles.h"  // defines KVSTRATA_AMX where it builds

#if defined(__AVX512VNNI__) && defined(__AVX512F__)
#include <immintrin.h>
#define KVSTRATA_VNNI 1
#elif defined(__AVX2__)
#include <immintrin.h>
#define KVSTRATA_AVX2 1
#endif

namespace {

constexpr int kLanes = 16;  // output rows per packed block
constexpr int kMaxRows = 8;  // activation rows per pass: 8 x 2 blocks = 16 accumulators
#if KVSTRATA_AVX2
constexpr int32_t kOffset = 0;  // the AVX2 sums are over x - 128 already
#else
constexpr int32_t kOffset = 128;  // sums over the unsigned x: minus 128 * wsum
#endif

#if KVSTRATA_AVX2
// sums[r][i] = dot(xu[r] - 128, output row i of the block at w) for N <= 4 rows
template <int N>
void block_rows(const uint32_t* const* xu, const int8_t* w, int64_t groups, int32_t* sums /* [N][32] */) {
  __m256i acc[N][2];
  for (int r = 0; r < N; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
  const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int64_t g = 0; g < groups; ++g) {
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + g * 64));
    const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + g * 64 + 32));
    const __m256i a0 = _mm256_abs_epi8(w0), a1 = _mm256_abs_epi8(w1);
    for (int r = 0; r < N; ++r) {
      const __m256i x = _mm256_xor_si256(_mm256_set1_epi32(static_cast<int>(xu[r][g])), flip);  // xu - 128 as s8
      acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(a0, _mm256_sign_epi8(x, w0)), ones));
      acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(a1, _mm256_sign_epi8(x, w1)), ones));
    }
  }
  for (int r = 0; r < N; ++r) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(sums + r * 2 * kLanes), acc[r][0]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(sums + r * 2 * kLanes + 8), acc[r][1]);
  }
}
#endif

// sums[r][b * 16 + i] = dot(xu[r], block nb + b's output row i) for R rows and 2 blocks (one when
// `two` is false)
template <int R>
void block_pair(const uint32_t* const* xu, const int8_t* wp, int64_t groups, bool two, int32_t* sums) {
#if KVSTRATA_VNNI
  __m512i acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
  const int8_t* w1 = wp + groups * 64;
  if (two) {
    for (int64_t g = 0; g < groups; ++g) {
      const __m512i a0 = _mm512_loadu_si512(wp + g * 64), a1 = _mm512_loadu_si512(w1 + g * 64);
      for (int r = 0; r < R; ++r) {
        const __m512i x = _mm512_set1_epi32(static_cast<int>(xu[r][g]));
        acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], x, a0);
        acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], x, a1);
      }
    }
  } else {
    for (int64_t g = 0; g < groups; ++g) {
      const __m512i a0 = _mm512_loadu_si512(wp + g * 64);
      for (int r = 0; r < R; ++r) acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], _mm512_set1_epi32(static_cast<int>(xu[r][g])), a0);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_si512(sums + r * 2 * kLanes, acc[r][0]);
    _mm512_storeu_si512(sums + r * 2 * kLanes + kLanes, acc[r][1]);
  }
#elif KVSTRATA_AVX2
  // a block at a time, four rows a pass (8 accumulators of 16 ymm registers); its 9 KB stay in L1
  for (int b = 0; b < (two ? 2 : 1); ++b) {
    const int8_t* w = wp + b * groups * 64;
    block_rows<(R < 4 ? R : 4)>(xu, w, groups, sums + b * kLanes);
    if constexpr (R > 4) block_rows<R - 4>(xu + 4, w, groups, sums + 4 * 2 * kLanes + b * kLanes);
  }
#else
  for (int r = 0; r < R; ++r) {
    const uint8_t* x = reinterpret_cast<const uint8_t*>(xu[r]);
    for (int b = 0; b < (two ? 2 : 1); ++b) {
      int32_t acc[kLanes] = {};
      const int8_t* w = wp + b * groups * 64;
      for (int64_t g = 0; g < groups; ++g)
        for (int i = 0; i < kLanes; ++i)
          for (int j = 0; j < 4; ++j) acc[i] += static_cast<int32_t>(x[4 * g + j]) * w[g * 64 + 4 * i + j];
      std::copy(acc, acc + kLanes, sums + r * 2 * kLanes + b * kLanes);
    }
  }
#endif
}

#if KVSTRATA_AMX
constexpr int64_t kAmxMinRows = 4;  // calls of this many rows take the tiles, 16 rows a pass

// sums[r][b * 16 + i] = dot(xs[r], block b's output row i) for the rows of xs (signed bytes, row stride
// K, a multiple of 64) the tiles are shaped for, and 2 blocks (one when `two` is false). Tiles: 0, 1 the
// blocks' sums [R x 16 int32]; 2 the rows' next 64 inputs; 3, 4 the blocks' next 16 groups of 4 inputs
void amx_block_pair(const int8_t* xs, int64_t K, const int8_t* wp, int64_t groups, bool two, int32_t* sums) {
  const int8_t* w1 = wp + groups * 64;
  _tile_zero(0);
  _tile_zero(1);
  for (int64_t k = 0; k < K; k += 64) {
    _tile_loadd(2, xs + k, K);
    _tile_loadd(3, wp + k * 16, 64);  // groups k / 4 .. k / 4 + 15, 64 bytes each
    _tile_dpbssd(0, 2, 3);
    if (two) {
      _tile_loadd(4, w1 + k * 16, 64);
      _tile_dpbssd(1, 2, 4);
    }
  }
  _tile_stored(0, sums, 2 * kLanes * sizeof(int32_t));
  if (two) _tile_stored(1, sums + kLanes, 2 * kLanes * sizeof(int32_t));
}
#endif

using PairFn = void (*)(const uint32_t* const*, const int8_t*, int64_t, bool, int32_t*);
constexpr PairFn kPair[kMaxRows + 1] = {nullptr, block_pair<1>, block_pair<2>, block_pair<3>, block_pair<4>,
                                        block_pair<5>, block_pair<6>, block_pair<7>, block_pair<8>};

template <typename scalar_t>
void quantize_rows(const scalar_t* x, int64_t rows, int64_t K, std::vector<uint8_t>& xu, std::vector<float>& sx) {
  for (int64_t r = 0; r < rows; ++r) {
    const scalar_t* xr = x + r * K;
    float amax = 0.f;
    for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(static_cast<float>(xr[k])));
    const float scale = amax > 0.f ? amax / 127.f : 1.f;
    sx[r] = scale;
    for (int64_t k = 0; k < K; ++k) {
      const float q = std::nearbyint(static_cast<float>(xr[k]) / scale);  // half to even, as torch.round
      xu[r * K + k] = static_cast<uint8_t>(static_cast<int>(std::clamp(q, -127.f, 127.f)) + 128);
    }
  }
}

at::Tensor int8_head_logits(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& wsum,
                            const at::Tensor& wscale) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "x: a contiguous [rows, hidden] tensor");
  TORCH_CHECK(packed.dim() == 4 && packed.is_contiguous() && packed.scalar_type() == at::kChar &&
              packed.size(2) == kLanes && packed.size(3) == 4, "packed: int8 [N / 16, hidden / 4, 16, 4]");
  const int64_t rows = x.size(0), K = x.size(1), blocks = packed.size(0), groups = packed.size(1), N = blocks * kLanes;
  TORCH_CHECK(groups * 4 == K, "packed holds hidden ", groups * 4, ", x has ", K);
  TORCH_CHECK(wsum.scalar_type() == at::kInt && wsum.numel() == N && wsum.is_contiguous(), "wsum: int32 [N]");
  TORCH_CHECK(wscale.scalar_type() == at::kFloat && wscale.numel() == N && wscale.is_contiguous(), "wscale: float32 [N]");
  std::vector<uint8_t> xu(rows * K);
  std::vector<float> sx(rows);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "int8_head_logits", [&] {
    quantize_rows<scalar_t>(x.data_ptr<scalar_t>(), rows, K, xu, sx);
  });
  auto out = at::empty({rows, N}, x.options().dtype(at::kFloat));
  float* o = out.data_ptr<float>();
  const int8_t* w = packed.data_ptr<int8_t>();
  const int32_t* ws = wsum.data_ptr<int32_t>();
  const float* sw = wscale.data_ptr<float>();
  const int64_t pairs = (blocks + 1) / 2;
  bool amx = false;  // the dots on tiles, over signed bytes x: sums over x + 128 less 128 * wsum, so no offset
#if KVSTRATA_AMX
  amx = rows >= kAmxMinRows && K % 64 == 0 && kvstrata::amx_ready();
  std::vector<int8_t> xs(amx ? rows * K : 0);
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<int8_t>(static_cast<int>(xu[i]) - 128);
#endif
  std::vector<uint32_t> xw(amx ? 0 : rows * K / 4);  // the kernels read four bytes at a time: copied, not read through a cast
  std::memcpy(xw.data(), xu.data(), xw.size() * sizeof(uint32_t));
  const int64_t pass = amx ? 16 : kMaxRows;  // rows a pass
  const int32_t offset = amx ? 0 : kOffset;
  at::parallel_for(0, pairs, 16, [&](int64_t first, int64_t last) {
    alignas(64) int32_t sums[16 * 2 * kLanes];
    const uint32_t* xr[kMaxRows];
#if KVSTRATA_AMX
    kvstrata::TileShapes tiles;
#endif
    for (int64_t r0 = 0; r0 < rows; r0 += pass) {
      const int R = static_cast<int>(std::min<int64_t>(pass, rows - r0));
#if KVSTRATA_AMX
      if (amx) {
        for (int t : {0, 1, 2}) tiles.set(t, R, 64);
        for (int t : {3, 4}) tiles.set(t, 16, 64);
        tiles.load();
      }
#endif
      if (!amx)
        for (int r = 0; r < R; ++r) xr[r] = xw.data() + (r0 + r) * K / 4;
      for (int64_t p = first; p < last; ++p) {
        const int64_t nb = 2 * p;
        const bool two = nb + 1 < blocks;
#if KVSTRATA_AMX
        if (amx)
          amx_block_pair(xs.data() + r0 * K, K, w + nb * groups * 64, groups, two, sums);
        else
#endif
          kPair[R](xr, w + nb * groups * 64, groups, two, sums);
        const int64_t n0 = nb * kLanes, width = (two ? 2 : 1) * kLanes;
        for (int r = 0; r < R; ++r) {
          float* dst = o + (r0 + r) * N + n0;
          for (int64_t i = 0; i < width; ++i)
            dst[i] = static_cast<float>(sums[r * 2 * kLanes + i] - offset * ws[n0 + i]) * sx[r0 + r] * sw[n0 + i];
        }
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kvstrata, m) {
  m.def("int8_head_logits(Tensor x, Tensor packed, Tensor wsum, Tensor wscale) -> Tensor");
}

TORCH_LIBRARY_IMPL(kvstrata, CPU, m) {
  m.impl("int8_head_logits", &int8_head_logits);
}
