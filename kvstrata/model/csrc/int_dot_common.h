// The packed layout of csrc/int_dot_linear.cpp and csrc/int_dot_dequant.cpp (model/quant/int_dot.py packs it),
// and the activations' quantization the linear op shares across its parts.
//
// A weight is w = scale * q + bias per group, q unsigned (model/quant/blocks.py). It is held per block of
// 16 output rows x 32 inputs (a "tile"), in one of four formats named by the bits of q:
//   q4: low plane 256 B                 + 16 scales, 16 biases (float16)           = 320 B  (Q4_1)
//   q5: low plane 256 B + high  64 B    + 16 scales, 16 biases                     = 384 B  (Q5_1, Q5_K)
//   q6: low plane 256 B + high 128 B    + 2 x 16 scales, 2 x 16 biases (group 16)  = 512 B
//   q8: low plane 256 B + high 256 B    + 16 scales, 16 biases                     = 576 B
// A symmetric block type (bias = -zero * scale, zero = 2^(bits - 1): Q4_0, Q5_0, Q6_K, Q8_0) keeps no biases:
// its format ("q4s" 288 B, "q5s" 352 B, "q6s" 448 B, "q8s" 544 B: the file's own bits a weight but for Q6_K's
// 7.0 against 6.56) computes each bias as scale * -zero, exact in float32 (a power of two times a float16),
// so the same float operations give the same bits as the stored bias would.
// Q4_K keeps its own scale encoding ("q4k", 296 B a tile on average, 4.625 bits a weight against the file's
// 4.5): a tile is the low plane + 16 scale bytes sc + 16 min bytes m (one a row; 288 B), and each run of 8
// tiles along K (a K-quant super-block of 256 inputs, "super-tile" of 2,368 B) ends with 16 float16 d and 16
// float16 -dmin (one a row): scale = d * sc, bias = -dmin * m, both exact in float32.
// Low plane: four 64-byte vectors v; byte 4i + b of vector v holds q & 15 of row i at input 4v + b in its
// low nibble and at input 16 + 4v + b in its high nibble, so one load and a mask or a shift feed 16 rows'
// lanes (4 inputs a 32-bit lane). The high bits (q >> 4) take the same arrangement, H[v], packed:
//   q8: H[v] as is (4 x 64 B); q6: P[u] = H[2u] | H[2u+1] << 2 (2 x 64 B); q5: P = H0 | H1 << 1 | H2 << 2 | H3 << 3.
// Scales and biases: per group (q6: inputs 0-15, then 16-31), 16 float16 (one a row), then the biases alike.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace kvstrata_int_dot {

constexpr int kLanes = 16;      // output rows per tile
constexpr int kGroup = 32;      // inputs per tile (and per activation block)
constexpr int kLowBytes = 256;  // the low plane of a tile
constexpr float kMax16 = 127 * 256 + 127;  // |x16| bound: both of its bytes stay in -128..127
constexpr float kMax8 = 127;               // |x8| bound (8-bit activations: hi is 0)

constexpr int kSuperTiles = 8;                     // q4k: tiles a super-tile (256 inputs)
constexpr int64_t kKTile = kLowBytes + 2 * kLanes;  // q4k: a tile (low plane, sc, m) = 288 B
constexpr int64_t kKSuper = kSuperTiles * kKTile + 2 * 2 * kLanes;  // + d, -dmin (float16) = 2,368 B

struct Format {
  int high_bits;  // 0 (q4), 1 (q5), 2 (q6), 4 (q8)
  int groups;     // scale groups a tile's row holds: 1, or 2 (q6: 16 inputs each)
  bool symmetric = false;  // no stored biases: bias = -zero() * scale
  bool kblocks = false;    // q4k: 8-bit sc and m a tile row, d and -dmin a super-tile row
  constexpr int64_t high_bytes() const { return 64 * high_bits; }
  constexpr int64_t scale_bytes() const { return 2 * kLanes * groups; }  // float16 scales (and as many biases, stored)
  // a tile's bytes (q4k: on average; the packed tensor's last size either way)
  constexpr int64_t bytes() const {
    return kblocks ? kKSuper / kSuperTiles : kLowBytes + high_bytes() + (symmetric ? 1 : 2) * scale_bytes();
  }
  constexpr float zero() const { return static_cast<float>(8 << high_bits); }  // 2^(bits - 1): 8, 16, 32, 128
};

constexpr Format kQ4{0, 1}, kQ5{1, 1}, kQ6{2, 2}, kQ8{4, 1};
constexpr Format kQ4s{0, 1, true}, kQ5s{1, 1, true}, kQ6s{2, 2, true}, kQ8s{4, 1, true};
constexpr Format kQ4k{0, 1, false, true};

// tile j of the tile column at col
inline const uint8_t* tile_at(const uint8_t* col, int64_t j, Format f) {
  return f.kblocks ? col + (j / kSuperTiles) * kKSuper + (j % kSuperTiles) * kKTile : col + j * f.bytes();
}

// q4k: the float16 d (then -dmin, 32 bytes on) of the super-tile holding tile j of the column at col
inline const uint8_t* k_super_scales(const uint8_t* col, int64_t j) {
  return col + (j / kSuperTiles) * kKSuper + kSuperTiles * kKTile;
}

// The format of a packed tensor [N / 16, K / 32, bytes], by its tile size.
inline Format format_of(const at::Tensor& packed) {
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() && packed.dim() == 3,
              "packed: a contiguous uint8 [N / 16, K / 32, tile bytes] tensor");
  for (const Format f : {kQ4, kQ5, kQ6, kQ8, kQ4s, kQ5s, kQ6s, kQ8s, kQ4k})
    if (packed.size(2) == f.bytes()) {
      TORCH_CHECK(!f.kblocks || packed.size(1) % kSuperTiles == 0, "packed: q4k needs in_features a multiple of 256");
      return f;
    }
  TORCH_CHECK(false, "packed: tile bytes ", packed.size(2), " is none of 320 (q4), 384 (q5), 512 (q6), 576 (q8), "
              "288 (q4s), 352 (q5s), 448 (q6s), 544 (q8s), 296 (q4k)");
  return kQ4;
}

// group g's scale and bias of row i in tile j of the column at col (portable code and the dequant op)
inline void scale_bias(const uint8_t* col, int64_t j, Format f, int g, int i, float& scale, float& bias) {
  const uint8_t* wb = tile_at(col, j, f);
  if (f.kblocks) {
    const c10::Half* dm = reinterpret_cast<const c10::Half*>(k_super_scales(col, j));
    scale = static_cast<float>(dm[i]) * static_cast<float>(wb[kLowBytes + i]);
    bias = static_cast<float>(dm[kLanes + i]) * static_cast<float>(wb[kLowBytes + kLanes + i]);
    return;
  }
  const c10::Half* sc = reinterpret_cast<const c10::Half*>(wb + kLowBytes + f.high_bytes());
  scale = static_cast<float>(sc[kLanes * g + i]);
  bias = f.symmetric ? scale * -f.zero() : static_cast<float>(sc[kLanes * (f.groups + g) + i]);
}

inline int32_t load4(const int8_t* p) {  // four activation bytes as one lane (memcpy: no aliasing through int32_t*)
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

struct Activations {  // x quantized per row and block of 32: x = scale * (256 hi + lo); 8 bits: hi = 0
  std::vector<int8_t> hi, lo;  // [rows, K]
  std::vector<float> scale, sum;  // [rows, K / 32]: the scale, the float sum of the block's x
  std::vector<float> sum16;  // [rows, K / 16]: the sums of each half block (q6's groups)
  bool wide = true;  // 16-bit integers (hi and lo), or 8-bit (lo only; the kernels skip hi)
  std::vector<int32_t> isum;  // 8 bits: [rows, K / 32], the sum of the block's integers (q8 on signed bytes)
};

// The float sums of a block of 32 in one fixed order (vector and portable code alike, so every form
// gives the same bits): a[l] = x[l] + x[8 + l], b[l] = x[16 + l] + x[24 + l] for l < 8; each half is
// ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)) of its a or b; the block's sum is half0 + half1.
inline float sum8(const float* v) {
  return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

// one block of 32 values -> its scale, sums and 16-bit integers as hi/lo bytes (wide), or 8-bit ones
// in lo with hi 0 (scale = max |x| / 127, as llama.cpp's Q8 activations, per block of 32)
// (isum: the 8-bit integers' sum; left alone when wide)
inline void quantize_block(const float* xb, float& scale, float& sum, float* half, int8_t* hi, int8_t* lo, int32_t& isum,
                           bool wide) {
  const float bound = wide ? kMax16 : kMax8;
#if defined(__AVX2__) && defined(__FMA__)
  __m256 y[4];
  for (int v = 0; v < 4; ++v) y[v] = _mm256_loadu_ps(xb + 8 * v);
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, y[0]), _mm256_andnot_ps(sign, y[1])),
                           _mm256_max_ps(_mm256_andnot_ps(sign, y[2]), _mm256_andnot_ps(sign, y[3])));
  alignas(32) float lanes[8], a[8], b[8];
  _mm256_store_ps(lanes, m);
  _mm256_store_ps(a, _mm256_add_ps(y[0], y[1]));
  _mm256_store_ps(b, _mm256_add_ps(y[2], y[3]));
  float amax = 0.f;
  for (float l : lanes) amax = std::max(amax, l);
  half[0] = sum8(a);
  half[1] = sum8(b);
  sum = half[0] + half[1];
  scale = amax > 0.f ? amax / bound : 1.f;
  const __m256 s = _mm256_set1_ps(scale), top = _mm256_set1_ps(bound), bottom = _mm256_set1_ps(-bound);
  __m256i h[4], l[4];
  for (int v = 0; v < 4; ++v) {
    const __m256 r = _mm256_round_ps(_mm256_div_ps(y[v], s), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256i q = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, bottom), top));
    h[v] = wide ? _mm256_srai_epi32(_mm256_add_epi32(q, _mm256_set1_epi32(128)), 8)  // floor: lo in -128..127
                : _mm256_setzero_si256();
    l[v] = _mm256_sub_epi32(q, _mm256_slli_epi32(h[v], 8));
  }
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undo packs' per-lane interleave
  auto bytes = [&](const __m256i* t) {
    return _mm256_permutevar8x32_epi32(
        _mm256_packs_epi16(_mm256_packs_epi32(t[0], t[1]), _mm256_packs_epi32(t[2], t[3])), order);
  };
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi), bytes(h));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo), bytes(l));
  if (!wide) {
    alignas(32) int32_t ls[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(ls), _mm256_add_epi32(_mm256_add_epi32(l[0], l[1]), _mm256_add_epi32(l[2], l[3])));
    isum = 0;
    for (int32_t v : ls) isum += v;
  }
#else
  float amax = 0.f, a[8], b[8];
  for (int t = 0; t < kGroup; ++t) amax = std::max(amax, std::fabs(xb[t]));
  for (int t = 0; t < 8; ++t) {
    a[t] = xb[t] + xb[8 + t];
    b[t] = xb[16 + t] + xb[24 + t];
  }
  half[0] = sum8(a);
  half[1] = sum8(b);
  sum = half[0] + half[1];
  scale = amax > 0.f ? amax / bound : 1.f;
  for (int t = 0; t < kGroup; ++t) {
    const int x16 = static_cast<int>(std::clamp(std::nearbyint(xb[t] / scale), -bound, bound));
    const int h = wide ? (x16 + 128) >> 8 : 0;  // floor: lo = x16 - 256 hi in -128..127
    hi[t] = static_cast<int8_t>(h);
    lo[t] = static_cast<int8_t>(x16 - 256 * h);
  }
  if (!wide) {
    isum = 0;
    for (int t = 0; t < kGroup; ++t) isum += lo[t];
  }
#endif
}

template <typename scalar_t>
Activations quantize(const scalar_t* x, int64_t rows, int64_t K, bool wide) {
  const int64_t nb = K / kGroup;
  Activations a{std::vector<int8_t>(rows * K), std::vector<int8_t>(rows * K), std::vector<float>(rows * nb),
                std::vector<float>(rows * nb), std::vector<float>(rows * nb * 2), wide, std::vector<int32_t>(wide ? 0 : rows * nb)};
  at::parallel_for(0, rows, 16, [&](int64_t first, int64_t last) {  // a prefill's rows over the threads
    float block[kGroup];
    int32_t unused = 0;  // isum of a wide block
    for (int64_t r = first; r < last; ++r) {
      for (int64_t j = 0; j < nb; ++j) {
        const scalar_t* xb = x + r * K + j * kGroup;
        const float* f = block;
        if constexpr (std::is_same_v<scalar_t, float>) {
          f = xb;
        } else {
          for (int t = 0; t < kGroup; ++t) block[t] = static_cast<float>(xb[t]);
        }
        const int64_t at = r * nb + j, off = r * K + j * kGroup;
        quantize_block(f, a.scale[at], a.sum[at], &a.sum16[2 * at], &a.hi[off], &a.lo[off], wide ? unused : a.isum[at], wide);
      }
    }
  });
  return a;
}

// q of row i (0..15) at input t (0..31) of the tile at w, in format f (portable code and the dequant op)
inline int tile_q(const uint8_t* w, Format f, int i, int t) {
  const int side = t / 16, v = (t % 16) / 4, b = t % 4, at = 4 * i + b;
  int q = (w[64 * v + at] >> (4 * side)) & 0x0F;
  const uint8_t* hp = w + kLowBytes;
  int high = 0;
  if (f.high_bits == 4) {
    high = w[kLowBytes + 64 * v + at];
  } else if (f.high_bits == 2) {
    high = (hp[64 * (v / 2) + at] >> (2 * (v % 2))) & 0x33;
  } else if (f.high_bits == 1) {
    high = (hp[at] >> v) & 0x11;
  }
  return q | (((high >> (4 * side)) & 0x0F) << 4);
}

}  // namespace kvstrata_int_dot
