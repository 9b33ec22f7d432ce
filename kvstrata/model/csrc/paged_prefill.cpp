// Paged prefill attention on CPU in bf16 with AVX-512 BF16 dot products (vdpbf16ps).
//
// torch's CPU flash kernel reaches 45-92 GFLOP/s on SmolLM2's shapes (9 heads of 64, 3 KV heads) where
// the bf16 GEMMs reach ~350, so attention was half of a 2k-token cold prefill. Here one sequence's
// chunk of n queries (at positions kv_len - n .. kv_len - 1) attends causally over its kv_len tokens,
// read from the page pool:
//   1. K and V are packed once per call into the pair layout vdpbf16ps wants, per KV head and block
//      of kBk tokens: Kp[p][j] = (k[j][2p], k[j][2p+1]), Vp[jp][d] = (v[2jp][d], v[2jp+1][d]) as 32-bit
//      lanes, zero past kv_len;
//   2. each work item is (KV head, block of kBq queries): its M = kBq x G query rows (the G query heads
//      that share the KV head) walk the K/V blocks up to the causal limit: scores S = q.k / sqrt(D) in
//      float32 (tiles of 6 rows x 64 tokens in 24 registers), an online softmax per row (its sum kept
//      per lane), P rounded to bf16 (as torch's flash kernel does), O += P V in float32 (rows x D tiles).
// A row's result depends only on its own position: K/V blocks are aligned to absolute token positions
// and masked tokens get weight exactly 0, so the same query gives the same bits whatever chunk or tile
// it is computed in (prefix cache on == off). The tiles are in paged_prefill_avx512.h; without AVX512-BF16
// the same tiles run as portable code (paged_prefill_portable.h: each pair's two products added in the
// instruction's order, odd element first), far slower: there the engine runs float32 prefill anyway
// (dtype_plan.py), and this path keeps the op and its tests alive on every CPU.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#define KVSTRATA_AVX512BF16 1
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "exp_approx.h"

namespace {

constexpr int kBk = 64;  // tokens per K/V block: 4 vectors of 16 scores
constexpr int kBq = 32;  // queries per work item
constexpr int kRows = 6;  // score tile: 6 rows x 4 vectors = 24 accumulators
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

#if KVSTRATA_AVX512BF16
#include "paged_prefill_avx512.h"
#else
#include "paged_prefill_portable.h"
#endif

template <int D, int R>
void score_rows(int rows, const uint32_t* const* q32, const uint32_t* kp, float scale, float* s) {
  int r = 0;
  for (; r + R <= rows; r += R) score_tile<D, R>(q32 + r, kp, scale, s + r * kBk);
  switch (rows - r) {  // the remainder, same arithmetic per row
    case 5: score_tile<D, 5>(q32 + r, kp, scale, s + r * kBk); break;
    case 4: score_tile<D, 4>(q32 + r, kp, scale, s + r * kBk); break;
    case 3: score_tile<D, 3>(q32 + r, kp, scale, s + r * kBk); break;
    case 2: score_tile<D, 2>(q32 + r, kp, scale, s + r * kBk); break;
    case 1: score_tile<D, 1>(q32 + r, kp, scale, s + r * kBk); break;
    default: break;
  }
}

template <int D>
void pv_rows(int rows, const uint32_t* p32, const uint32_t* vp, const float* alpha, float* o) {
  constexpr int R = std::max(1, std::min(6, 24 / (D / 16)));  // R x D/16 accumulators <= 24
  int r = 0;
  for (; r + R <= rows; r += R) pv_tile<D, R>(p32 + r * (kBk / 2), vp, alpha + r, o + r * D);
  for (; r < rows; ++r) pv_tile<D, 1>(p32 + r * (kBk / 2), vp, alpha + r, o + r * D);
}

inline uint32_t bits_of(const c10::BFloat16* row, int p) {
  uint32_t x;
  std::memcpy(&x, row + 2 * p, sizeof x);
  return x;
}

// Vp[d] = (a[d], b[d]) for one pair of token rows (b null past kv_len: zeros)
template <int D>
inline void pack_v_pair(const c10::BFloat16* a, const c10::BFloat16* b, uint32_t* vp) {
#if KVSTRATA_AVX512BF16 && defined(__AVX512BW__)
  if constexpr (D % 32 == 0) {
    alignas(64) static constexpr uint16_t kLo[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                                     8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
    const __m512i lo = _mm512_load_si512(kLo), hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    for (int c = 0; c < D; c += 32) {
      const __m512i x = _mm512_loadu_si512(a + c);
      const __m512i y = b != nullptr ? _mm512_loadu_si512(b + c) : _mm512_setzero_si512();
      _mm512_storeu_si512(vp + c, _mm512_permutex2var_epi16(x, lo, y));  // d = c .. c + 15
      _mm512_storeu_si512(vp + c + 16, _mm512_permutex2var_epi16(x, hi, y));  // d = c + 16 .. c + 31
    }
    return;
  }
#endif
  for (int d = 0; d < D; ++d)  // a's half low, b's high: the pair's little-endian layout
    vp[d] = static_cast<uint32_t>(a[d].x) | static_cast<uint32_t>(b != nullptr ? b[d].x : 0) << 16;
}

template <int D>
void paged_prefill_impl(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                        const at::Tensor& pages, int64_t kv_len, int64_t page_size, at::Tensor& out) {
  using bf16 = c10::BFloat16;
  const int64_t n = q.size(0), H = q.size(1), Hkv = k_cache.size(1);
  const int G = static_cast<int>(H / Hkv);
  const int64_t nkb = (kv_len + kBk - 1) / kBk;
  const int64_t* pg = pages.data_ptr<int64_t>();
  const bf16* k_p = k_cache.data_ptr<bf16>();
  const bf16* v_p = v_cache.data_ptr<bf16>();
  const bf16* q_p = q.data_ptr<bf16>();
  bf16* o_p = out.data_ptr<bf16>();
  constexpr int64_t block_words = kBk * D / 2;  // one packed block of K (or V), in 32-bit pairs
  // the calling thread's buffers, kept between calls: a few queries over a long context (an agent's next
  // turn) spent most of their time faulting in and zeroing fresh ones (docs/cpu-kernels.md)
  thread_local std::vector<uint32_t> kpack, vpack;
  const size_t words = static_cast<size_t>(Hkv * nkb * block_words);
  if (kpack.size() < words) {
    kpack.resize(words);
    vpack.resize(words);
  }
  uint32_t* const kbuf = kpack.data();  // the workers below use these: a thread_local names each thread's own
  uint32_t* const vbuf = vpack.data();
  // 1. pack: block (h, kb) of K as [D/2][kBk] pairs, of V as [kBk/2][D] pairs; zeros past kv_len
  at::parallel_for(0, Hkv * nkb, 1, [&](int64_t first, int64_t last) {
    for (int64_t item = first; item < last; ++item) {
      const int64_t h = item / nkb, kb = item % nkb;
      uint32_t* kp = kbuf + item * block_words;
      uint32_t* vp = vbuf + item * block_words;
      const int64_t t0 = kb * kBk;
      const int cnt = static_cast<int>(std::min<int64_t>(kBk, kv_len - t0));
      if (cnt < kBk) {  // a full block's words are all written below
        std::memset(kp, 0, block_words * sizeof(uint32_t));
        std::memset(vp, 0, block_words * sizeof(uint32_t));
      }
      auto row = [&](const bf16* cache, int j) {  // token t0 + j's row of KV head h
        const int64_t t = t0 + j, slot = pg[t / page_size] * page_size + t % page_size;
        return cache + (slot * Hkv + h) * D;
      };
      for (int j = 0; j < cnt; ++j) {
        const bf16* krow = row(k_p, j);
        for (int p = 0; p < D / 2; ++p) kp[p * kBk + j] = bits_of(krow, p);
      }
      for (int j = 0; j < cnt; j += 2) pack_v_pair<D>(row(v_p, j), j + 1 < cnt ? row(v_p, j + 1) : nullptr, vp + (j / 2) * D);
    }
  });
  // 2. attend: items (h, query block), ordered so that each thread's contiguous share mixes early
  // (short) and late (long) query blocks
  const int64_t nqb = (n + kBq - 1) / kBq;
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  at::parallel_for(0, Hkv * nqb, 1, [&](int64_t first, int64_t last) {
    const int M = kBq * G;
    std::vector<float> s(M * kBk), o(M * D), m(M), l(M * 16), alpha(M);
    std::vector<uint32_t> p32(M * kBk / 2);
    std::vector<uint32_t> qpairs(M * D / 2);  // the rows' bf16 pairs as 32-bit words (copied: no type punning)
    std::vector<const uint32_t*> q32(M);
    std::vector<int64_t> pos(M);
    for (int64_t item = first; item < last; ++item) {
      const int64_t h = item % Hkv, j = item / Hkv;
      const int64_t qb = j % 2 == 0 ? j / 2 : nqb - 1 - j / 2;
      const int64_t i0 = qb * kBq, qn = std::min<int64_t>(kBq, n - i0);
      const int rows = static_cast<int>(qn * G);
      for (int r = 0; r < rows; ++r) {  // row r = query i0 + r / G, head h * G + r % G
        const int64_t i = i0 + r / G;
        std::memcpy(qpairs.data() + r * D / 2, q_p + (i * H + h * G + r % G) * D, D * sizeof(bf16));
        q32[r] = qpairs.data() + r * D / 2;
        pos[r] = kv_len - n + i;
        m[r] = kNegInf;
        std::fill(l.begin() + r * 16, l.begin() + (r + 1) * 16, 0.f);
      }
      std::fill(o.begin(), o.begin() + rows * D, 0.f);
      const int64_t pos_lo = kv_len - n + i0, pos_hi = pos_lo + qn - 1;
      for (int64_t kb = 0; kb * kBk <= pos_hi; ++kb) {
        const uint32_t* kp = kbuf + (h * nkb + kb) * block_words;
        const uint32_t* vp = vbuf + (h * nkb + kb) * block_words;
        score_rows<D, kRows>(rows, q32.data(), kp, scale, s.data());
        const int64_t t0 = kb * kBk;
        const bool needs_mask = t0 + kBk - 1 > pos_lo;  // some row sees only part of this block
        for (int r = 0; r < rows; ++r) {
          float* sr = s.data() + r * kBk;
          if (needs_mask) {
            const int64_t valid = std::min<int64_t>(kBk, pos[r] - t0 + 1);  // tokens t0 .. pos[r]
            for (int64_t t = std::max<int64_t>(valid, 0); t < kBk; ++t) sr[t] = kNegInf;
          }
          softmax_block(sr, m[r], l.data() + r * 16, alpha[r], p32.data() + r * (kBk / 2));
        }
        pv_rows<D>(rows, p32.data(), vp, alpha.data(), o.data());
      }
      for (int r = 0; r < rows; ++r) {
        const int64_t i = i0 + r / G;
        bf16* dst = o_p + (i * H + h * G + r % G) * D;
        const float inv = 1.f / lane_sum(l.data() + r * 16);
        for (int d = 0; d < D; ++d) dst[d] = static_cast<bf16>(o[r * D + d] * inv);
      }
    }
  });
}

at::Tensor paged_prefill(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                         const at::Tensor& pages, int64_t kv_len, int64_t page_size) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 3 && v_cache.dim() == 3, "q [n,H,D], caches [S,Hkv,D]");
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous(), "contiguous inputs");
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && k_cache.scalar_type() == at::kBFloat16 &&
              v_cache.scalar_type() == at::kBFloat16, "bfloat16 q and caches");
  TORCH_CHECK(pages.scalar_type() == at::kLong && pages.is_contiguous() && pages.dim() == 1, "int64 pages [P]");
  const int64_t n = q.size(0), H = q.size(1), Hkv = k_cache.size(1), D = q.size(2);
  TORCH_CHECK(Hkv > 0 && H % Hkv == 0 && D == k_cache.size(2) && k_cache.sizes() == v_cache.sizes(),
              "heads and head dim");
  TORCH_CHECK(page_size >= 1 && n >= 1 && kv_len >= n && kv_len <= pages.size(0) * page_size, "kv_len ", kv_len,
              " for ", n, " queries over ", pages.size(0), " pages");
  const int64_t num_pages = k_cache.size(0) / page_size;
  const int64_t* pg = pages.data_ptr<int64_t>();
  for (int64_t i = 0; i < (kv_len + page_size - 1) / page_size; ++i)  // the pages read: inside the pool
    TORCH_CHECK(pg[i] >= 0 && pg[i] < num_pages, "page ", pg[i], " outside the pool of ", num_pages, " pages");
  auto out = at::empty_like(q);
  switch (D) {
    case 16: paged_prefill_impl<16>(q, k_cache, v_cache, pages, kv_len, page_size, out); break;
    case 32: paged_prefill_impl<32>(q, k_cache, v_cache, pages, kv_len, page_size, out); break;
    case 64: paged_prefill_impl<64>(q, k_cache, v_cache, pages, kv_len, page_size, out); break;
    case 128: paged_prefill_impl<128>(q, k_cache, v_cache, pages, kv_len, page_size, out); break;
    case 256: paged_prefill_impl<256>(q, k_cache, v_cache, pages, kv_len, page_size, out); break;
    default: TORCH_CHECK(false, "head dim must be one of 16, 32, 64, 128, 256; got ", D);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kvstrata, m) {
  m.def("paged_prefill(Tensor q, Tensor k_cache, Tensor v_cache, Tensor pages, int kv_len, int page_size) -> Tensor");
}

TORCH_LIBRARY_IMPL(kvstrata, CPU, m) {
  m.impl("paged_prefill", &paged_prefill);
}
