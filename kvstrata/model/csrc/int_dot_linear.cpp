// A GGUF's quantized linears (decode steps; prefill too with --prefill-weights int) on integer dot
// products, read from their own blocks (layout: int_dot_common.h). Activations are quantized per block
// of 32 to 16-bit integers split into two signed bytes (x16 = 256 hi + lo), or (act_bits 8) to one
// signed byte, hi = 0 and skipped: half the products. Then
//   y[n] = sum_g  scale[n, g] * sx * idot(x_g, q[n, g])  +  bias[n, g] * xsum_g
// over the weight's groups g (32 inputs; 16 for q6). 16 bits keep SmolLM2's greedy output equal to the
// float32 model's on the same weights (24 of 24 prompts); 8 bits, llama.cpp's activations, 10 of 24
// (docs/cpu-kernels.md). Every weight is read once per pass of rows; each tile column's next tiles are
// prefetched while one is computed. Several weights (the parts of a fused q/k/v or
// gate/up, each of its own type) run in one call on activations quantized once.
// Forms, chosen at build time from the compiler's target:
// - q4 with AVX512-VNNI: vpdpbusd (u8 weights x s8 activation bytes, four products a lane), 16 rows a zmm.
// - q4 with AVX2: vpmaddubsw (u8 x s8, pairs summed in 16 bits) and one vpmaddwd by ones per eight of
//   them (8 x 2 x 15 x 128 < 2^15: no saturation), 8 rows a ymm half: the same integers and then the
//   same float operations in the same order as on VNNI, so the same bits.
// - q5/q6/q8 with AVX2 (also on AVX-512 CPUs): q = low nibble | high bits << 4 rebuilt in registers
//   (q5/q6 at most 63: one vpmaddubsw pair sum <= 16128; q8 as two nibble planes, summed in 32 bits).
//   The AVX2 forms are in int_dot_avx2.h; q8 at 8-bit activations from kQ8SignedRows rows on signed bytes
//   (int_dot_q8_bytes.h), the same integers.
// - Portable loops with the same integers and float operations elsewhere, so every op and test runs
//   on every CPU; the model picks this op only where a vector form is built (cpu_kernels.int_dot_simd).
// Registered as torch.ops.kvstrata.int_dot_linear(x, parts).
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <string>

#include "int_dot_amx.h"  // defines KVSTRATA_AMX where it builds its form
#include "int_dot_avx2.h"  // defines KVSTRATA_AVX2 where it builds its forms
#include "int_dot_common.h"
#include "int_dot_q8_bytes.h"  // q8 batches on signed bytes (AVX2)

#if defined(__AVX512VNNI__) && defined(__AVX512F__)
#define KVSTRATA_VNNI 1
#endif
#if KVSTRATA_VNNI
#include <immintrin.h>
#endif

namespace {

using namespace kvstrata_int_dot;

constexpr int kMaxRows = 8;  // activation rows per q4 pass
// q4 and q8 calls of this many rows or more run on AMX tiles where built and granted (int_dot_amx.h), 16
// rows a pass. Each row's bits are the same either way.
constexpr int64_t kAmxMinRows = 4;
// q8 at 8-bit activations on signed bytes (int_dot_q8_bytes.h): tiles() given kQ8SignedRows rows or more
// (of a call's runs of kMaxRows) rebuilds them in registers a pass; a call of kQ8BuiltRows rows or more
// rebuilds each tile column once for all of them (run()): against the nibble planes (hb_half) the first
// gains from 3 rows and the second from 8-16 (docs/cpu-kernels.md has the figures).
constexpr int64_t kQ8SignedRows = 3, kQ8BuiltRows = 16;

// Portable: out[r][i] for R rows and one tile column, any format (the same integers and float operations)
void portable_tiles(const Activations& a, int64_t r0, int R, int64_t K, const uint8_t* w, Format f, float* out) {
  const int64_t nb = K / kGroup;
  const int G = f.groups;
  for (int r = 0; r < R; ++r) {
    float acc[kLanes] = {};
    const int8_t* xh = a.hi.data() + (r0 + r) * K;
    const int8_t* xl = a.lo.data() + (r0 + r) * K;
    for (int64_t j = 0; j < nb; ++j) {
      const uint8_t* wb = tile_at(w, j, f);
      const int64_t at = (r0 + r) * nb + j;
      for (int i = 0; i < kLanes; ++i) {
        int32_t dot[2] = {0, 0};
        for (int t = 0; t < kGroup; ++t) {
          const int64_t k = j * kGroup + t;
          dot[G == 2 ? t / 16 : 0] += tile_q(wb, f, i, t) * (256 * xh[k] + xl[k]);
        }
        float s[2], b[2];
        for (int g = 0; g < G; ++g) scale_bias(w, j, f, g, i, s[g], b[g]);
        for (int g = 0; g < G; ++g) acc[i] = std::fma(s[g] * a.scale[at], static_cast<float>(dot[g]), acc[i]);
        for (int g = 0; g < G; ++g) acc[i] = std::fma(b[g], G == 1 ? a.sum[at] : a.sum16[2 * at + g], acc[i]);
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
      const uint8_t* wb = tile_at(w, j, f);
      __m512i lo[4], hi[4];
      for (int v = 0; v < 4; ++v) {
        const __m512i raw = _mm512_loadu_si512(wb + 64 * v);
        lo[v] = _mm512_and_si512(raw, mask);
        hi[v] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), mask);
      }
      __m512 sc, bi;
      q4_scales_512(w, wb, j, f, sc, bi);
      for (int r = 0; r < R; ++r) {
        const int8_t* xh = a.hi.data() + (r0 + r) * K + j * kGroup;
        const int8_t* xl = a.lo.data() + (r0 + r) * K + j * kGroup;
        __m512i dh = _mm512_setzero_si512(), dl = _mm512_setzero_si512();
        for (int v = 0; v < 4; ++v) {  // lo[v]: inputs 4v..4v+3 of the block, hi[v]: 16 + 4v..
          if (a.wide) {
            dh = _mm512_dpbusd_epi32(dh, lo[v], _mm512_set1_epi32(load4(xh + 4 * v)));
            dh = _mm512_dpbusd_epi32(dh, hi[v], _mm512_set1_epi32(load4(xh + 16 + 4 * v)));
          }
          dl = _mm512_dpbusd_epi32(dl, lo[v], _mm512_set1_epi32(load4(xl + 4 * v)));
          dl = _mm512_dpbusd_epi32(dl, hi[v], _mm512_set1_epi32(load4(xl + 16 + 4 * v)));
        }
        const __m512i dot = a.wide ? _mm512_add_epi32(_mm512_slli_epi32(dh, 8), dl) : dl;
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
  if (!a.wide && f.high_bits == 4 && R >= kQ8SignedRows) {  // q8 on signed bytes, rebuilt in registers
    f.symmetric ? q8_bytes_passes<true, false>(a, r0, R, K, w, nullptr, out)
                : q8_bytes_passes<false, false>(a, r0, R, K, w, nullptr, out);
    return;
  }
  a.wide ? avx2_tiles<true>(a, r0, R, K, w, f, out) : avx2_tiles<false>(a, r0, R, K, w, f, out);
#else
  portable_tiles(a, r0, R, K, w, f, out);
#endif
}

template <typename scalar_t>
void run(const at::Tensor& x, const std::vector<at::Tensor>& parts, at::Tensor& out, bool wide) {
  const int64_t rows = x.size(0), K = x.size(1), N = out.size(1);
  const Activations a = quantize<scalar_t>(x.data_ptr<scalar_t>(), rows, K, wide);
  std::vector<int64_t> first_tile{0};  // tile columns of the parts, numbered across them
  std::vector<Format> formats;
  for (const at::Tensor& p : parts) {
    first_tile.push_back(first_tile.back() + p.size(0));
    formats.push_back(format_of(p));
  }
  scalar_t* o = out.data_ptr<scalar_t>();
#if KVSTRATA_AMX
  const bool amx = rows >= kAmxMinRows && kvstrata::amx_ready();
#endif
  at::parallel_for(0, first_tile.back(), 8, [&](int64_t first, int64_t last) {
    float tile[2 * 16 * kLanes];  // a pass's rows of one tile column (AMX: 16 rows of up to 2 columns, else kMaxRows)
#if KVSTRATA_AMX
    kvstrata::TileShapes tiles_amx;
#endif
#if KVSTRATA_AVX2
    std::vector<int8_t> q8_bytes;  // a q8 column rebuilt as signed bytes, for a batch of 8-bit rows
#endif
    for (int64_t c = first; c < last; ++c) {
      const size_t p = std::upper_bound(first_tile.begin(), first_tile.end(), c) - first_tile.begin() - 1;
      const Format f = formats[p];
      const uint8_t* w = parts[p].data_ptr<uint8_t>() + (c - first_tile[p]) * (K / kGroup) * f.bytes();
#if KVSTRATA_AMX
      const bool on_amx = amx && (f.high_bits == 0 || f.high_bits == 4);  // q4 and q8 formats
#else
      constexpr bool on_amx = false;
#endif
#if KVSTRATA_AVX2
      const bool q8_built = !on_amx && !wide && f.high_bits == 4 && rows >= kQ8BuiltRows;  // the column rebuilt once
      if (q8_built) {
        q8_bytes.resize((K / kGroup) * kQ8Bytes);
        q8_column_bytes(w, K / kGroup, f, q8_bytes.data());
      }
#endif
#if KVSTRATA_AMX
      if (on_amx) {
        const int cols = c + 1 < last && c + 1 < first_tile[p + 1] ? 2 : 1;  // this column and the next of its weight
        const auto keep = [&](int64_t r0, int R, int cc, const float* t) {  // t: R rows of column c + cc
          for (int r = 0; r < R; ++r)
            for (int i = 0; i < kLanes; ++i) o[(r0 + r) * N + (c + cc) * kLanes + i] = static_cast<scalar_t>(t[r * kLanes + i]);
        };
        for (int64_t r0 = 0; r0 < rows;) {
          const int R = static_cast<int>(std::min<int64_t>(2 * kAmxRows, rows - r0));
          if (cols == 2 && R <= kAmxRows) {  // one block: both columns on its activation tiles
            amx_q4_shapes(tiles_amx, R);
            amx_q4_pair(a, r0, R, K, w, w + (K / kGroup) * f.bytes(), f, tile);
            for (int cc = 0; cc < 2; ++cc) keep(r0, R, cc, tile + cc * R * kLanes);
          } else {  // each column walked once for up to two 16-row blocks
            amx_column_shapes(tiles_amx, R);
            for (int cc = 0; cc < cols; ++cc) {
              amx_column(a, r0, R, K, w + cc * (K / kGroup) * f.bytes(), f, tile);
              keep(r0, R, cc, tile);
            }
          }
          r0 += R;
        }
        c += cols - 1;
        continue;
      }
#endif
      for (int64_t r0 = 0; r0 < rows; r0 += kMaxRows) {
        const int R = static_cast<int>(std::min<int64_t>(kMaxRows, rows - r0));
#if KVSTRATA_AVX2
        if (q8_built) {
          f.symmetric ? q8_bytes_passes<true, true>(a, r0, R, K, w, q8_bytes.data(), tile)
                      : q8_bytes_passes<false, true>(a, r0, R, K, w, q8_bytes.data(), tile);
        } else {
          tiles(a, r0, R, K, w, f, tile);
        }
#else
        tiles(a, r0, R, K, w, f, tile);
#endif
        for (int r = 0; r < R; ++r)
          for (int i = 0; i < kLanes; ++i) o[(r0 + r) * N + c * kLanes + i] = static_cast<scalar_t>(tile[r * kLanes + i]);
      }
    }
  });
}

at::Tensor int_dot_linear(const at::Tensor& x, at::TensorList parts, int64_t act_bits) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "x: a contiguous [rows, in_features] tensor");
  TORCH_CHECK(act_bits == 8 || act_bits == 16, "act_bits: 8 or 16, not ", act_bits);
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
    run<scalar_t>(x, kept, out, act_bits == 16);
  });
  return out;
}

// which form this build runs for q4 (int8_head.cpp is built with the same flags): for logs and tests
std::string int_dot_isa() {
#if KVSTRATA_AMX
  if (kvstrata::amx_ready()) return "amx_int8";
#endif
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
  m.def("int_dot_linear(Tensor x, Tensor[] parts, int act_bits=16) -> Tensor");
  m.def("int_dot_isa() -> str", &int_dot_isa);
}

TORCH_LIBRARY_IMPL(kvstrata, CPU, m) {
  m.impl("int_dot_linear", &int_dot_linear);
}
