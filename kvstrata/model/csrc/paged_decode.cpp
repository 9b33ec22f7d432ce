// Paged decode attention on CPU: one query token per sequence, K/V read in place from the page pool.
//
// The torch path gathers every row's pages into a contiguous copy, transposes it head-major and
// runs two matmuls; at a 2k context that is three passes over the K/V bytes and ~10 ops a layer.
// Here each work item (row, span of the context, set of KV heads) streams its pages once: per block of
// tokens and KV head, scores for the G query heads that share it, an online softmax, and the weighted
// sum of V, in float32 (a float32 cache's rows are read in place, not copied). An item takes all its
// KV heads block by block, so a block's slots (all heads side by side) are read whole and in order: an
// item per head would read one slice of each slot, a strided read a few times slower than reading the
// whole slots (docs/cpu-kernels.md, "Attention").
// Contexts are split into spans of fixed length, so that both cores work on a batch of one (short ones
// into sets of heads as well); spans are merged by their log-sum-exp (as flash-decoding does).
// A verify step (engine/spec/) gives one request several rows, each one token further over the same
// pages: such rows form a group, and an item scores all the group's query rows against each K/V row
// it loads, so the request's context is read once a step, not once a row.
//
// Registered as torch.ops.kvstrata.paged_decode (no pybind, no Python.h): built and loaded by
// kvstrata/model/cpu_kernels.py with -O3 -march=native, cached per source, torch and CPU.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "amx_tiles.h"  // KVSTRATA_AMX_BF16: a bf16 cache's attention on tiles (paged_decode_amx.h)
#include "exp_approx.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define KVSTRATA_AVX2 1
#if defined(__AVX512F__)  // every head size (16-256) is a multiple of 16 floats
#define KVSTRATA_AVX512 1
#endif
#endif

namespace {

using kvstrata::exp_nonpositive;

constexpr int kBlock = 32;   // tokens scored before one softmax rescale
constexpr int kMaxGroup = 16;  // query heads per KV head
// query rows one item scores: a row group's rows x the query heads of a KV head. Each group reads the
// context's K/V once, so the rows of a prefill chunk (128 of them at 2 query heads a KV head) in one group
// read a long context once a layer, not once per 32 rows (docs/cpu-kernels.md)
constexpr int kMaxQueries = 256;
constexpr int64_t kMaxSplits = 64;  // spans per (row, KV head): the merge keeps their weights on the stack
constexpr int64_t kSpan = 256;  // tokens a span holds (a multiple of kBlock) up to kMaxSplits spans

#include "paged_decode_fma.h"  // attend_block: a span step in float32 FMAs; Partial, start_partial
#include "paged_decode_amx.h"  // attend_span_amx: the same step for a bf16 cache on AMX-BF16

// Consecutive rows that one item can serve together: each longer than the one before and on the same
// pages over that one's length (a request's verify rows), at most max_rows of them. Returns the first
// row of each group, then B. Pages equal over a row's length are the same tokens, so any rows that pass
// may share, whoever's they are.
std::vector<int64_t> row_groups(const int64_t* lens, const int64_t* pages, int64_t B, int64_t P, int64_t page_size,
                                int64_t max_rows) {
  std::vector<int64_t> starts{0};
  for (int64_t b = 1; b < B; ++b) {
    const int64_t used = (lens[b - 1] + page_size - 1) / page_size;
    const bool joins = b - starts.back() < max_rows && lens[b] > lens[b - 1] &&
                       std::equal(pages + (b - 1) * P, pages + (b - 1) * P + used, pages + b * P);
    if (!joins) starts.push_back(b);
  }
  starts.push_back(B);
  return starts;
}

template <typename scalar_t, int D>
void paged_decode_impl(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                       const at::Tensor& pages, const at::Tensor& lens, int64_t page_size, at::Tensor& out) {
  const int64_t B = q.size(0), H = q.size(1), Hkv = k_cache.size(1), P = pages.size(1);
  const int G = static_cast<int>(H / Hkv);
  const int64_t* lens_p = lens.data_ptr<int64_t>();
  const int64_t* pages_p = pages.data_ptr<int64_t>();
  int64_t max_len = 1;
  for (int64_t b = 0; b < B; ++b) max_len = std::max(max_len, lens_p[b]);  // checked by paged_decode
  const std::vector<int64_t> groups = row_groups(lens_p, pages_p, B, P, page_size, kMaxQueries / G);
  const int64_t num_groups = static_cast<int64_t>(groups.size()) - 1;
  // spans of kSpan tokens whatever the step's other rows: a row's spans, and so its bits, are those it has
  // alone (a verify row's are its one-row step's, engine/spec/: greedy output the same with drafts); past
  // kMaxSplits of them (a row of 16k tokens) every row's spans double. Where that leaves a thread without an
  // item (short contexts), sets of heads as well
  const int64_t threads = at::get_num_threads();
  int64_t span = kSpan;
  while ((max_len + span - 1) / span > kMaxSplits) span *= 2;
  const int64_t splits = (max_len + span - 1) / span;
  const int64_t head_sets = std::clamp<int64_t>((2 * threads + num_groups * splits - 1) / (num_groups * splits), 1, Hkv);
  // per (row, KV head, span): G query rows' partial results, merged below. Not zeroed: every one a row's merge
  // reads was set by start_partial (the AMX form: its m and l, and the accumulator at the row's first live
  // chunk of the span, which each of its own spans has), and with fixed spans a wide batch at a long context
  // holds MBs of them a call
  const int64_t num_parts = B * Hkv * splits * G;
  std::unique_ptr<float[]> acc(new float[num_parts * D]), ms(new float[num_parts]), ls(new float[num_parts]);
  const scalar_t* q_p = q.data_ptr<scalar_t>();
  const scalar_t* k_p = k_cache.data_ptr<scalar_t>();
  const scalar_t* v_p = v_cache.data_ptr<scalar_t>();
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  int64_t max_q = 0;  // query rows of the largest group
  for (int64_t gi = 0; gi < num_groups; ++gi) max_q = std::max(max_q, (groups[gi + 1] - groups[gi]) * G);
  const int64_t max_heads = (Hkv + head_sets - 1) / head_sets;
#if KVSTRATA_AMX_BF16
  const bool amx = std::is_same_v<scalar_t, c10::BFloat16> && kvstrata::amx_ready();
#else
  constexpr bool amx = false;
#endif
  at::parallel_for(0, num_groups * splits * head_sets, 1, [&](int64_t first, int64_t last) {
    // per head of the item: its Q query rows in float32, scaled (the FMA form; the AMX form reads the bf16 rows)
    std::unique_ptr<float[]> qf(amx ? nullptr : new float[max_heads * max_q * D]);
    std::vector<Partial> parts(max_heads);
    int64_t limit[kMaxQueries];
#if KVSTRATA_AMX_BF16
    // a head's queries as A tiles ([Q, D] bf16 rows), and the chunk buffers (paged_decode_amx.h)
    std::unique_ptr<c10::BFloat16[]> qa(amx ? new c10::BFloat16[max_heads * kMaxQueries * D] : nullptr);
    std::unique_ptr<SpanScratch<D>> scratch(amx ? new SpanScratch<D>() : nullptr);
    kvstrata::TileShapes tiles;
#endif
    for (int64_t item = first; item < last; ++item) {
      const int64_t gi = item / (splits * head_sets), sp = (item / head_sets) % splits, hs = item % head_sets;
      const int64_t h0 = hs * Hkv / head_sets, h1 = (hs + 1) * Hkv / head_sets;
      const int64_t b0 = groups[gi], rows = groups[gi + 1] - b0, top = groups[gi + 1] - 1;  // top: the longest row
      // a span past the group's longest row (a short group's tail, as fixed spans give a batch of mixed
      // lengths) holds none of its tokens, and no row merges it (each merges its own spans): skipped
      const int64_t begin = sp * span, end = std::min(lens_p[top], begin + span);
      if (begin >= end) continue;
      const int Q = static_cast<int>(rows * G);
      for (int q = 0; q < Q; ++q) limit[q] = lens_p[b0 + q / G];
      for (int64_t h = h0; h < h1; ++h) {
        Partial& part = parts[h - h0];
        for (int q = 0; q < Q; ++q) {
          const int64_t b = b0 + q / G, base = ((b * Hkv + h) * splits + sp) * G + q % G;
          part.acc[q] = acc.get() + base * D;
          part.m[q] = ms.get() + base;
          part.l[q] = ls.get() + base;
          const scalar_t* qh = q_p + (b * H + h * G + q % G) * D;
#if KVSTRATA_AMX_BF16
          if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
            if (amx) {  // the tiles' queries are the bf16 rows themselves
              std::memcpy(qa.get() + ((h - h0) * kMaxQueries + q) * D, qh, D * sizeof(scalar_t));
              continue;
            }
          }
#endif
          float* qh_f = qf.get() + ((h - h0) * max_q + q) * D;
          for (int d = 0; d < D; ++d) qh_f[d] = to_float(qh[d]) * scale;
        }
        start_partial<D>(Q, part, !amx);
      }
#if KVSTRATA_AMX_BF16
      if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
        if (amx) {
          const bool whole = h1 - h0 > 1;  // the first head brings the item's slots (paged_decode_amx_chunk.h)
          for (int64_t h = h0; h < h1; ++h)
            attend_span_amx<D>(qa.get() + (h - h0) * kMaxQueries * D, Q, limit, k_p + h * D, v_p + h * D, Hkv * D,
                               pages_p + top * P, page_size, begin, end, scale, parts[h - h0], *scratch, tiles,
                               whole && h == h0 ? k_p + h0 * D : nullptr, whole && h == h0 ? v_p + h0 * D : nullptr,
                               (h1 - h0) * D * 2);
          continue;
        }
      }
#endif
      for (int64_t t0 = begin; t0 < end; t0 += kBlock) {
        const int n = static_cast<int>(std::min<int64_t>(kBlock, end - t0));
        for (int64_t h = h0; h < h1; ++h) {
          attend_block<scalar_t, D>(qf.get() + (h - h0) * max_q * D, Q, limit, k_p + h * D, v_p + h * D,
                                    Hkv * D, pages_p + top * P, page_size, t0, n, parts[h - h0]);
        }
      }
    }
  });
  scalar_t* o_p = out.data_ptr<scalar_t>();
  // each (row, KV head) merges its spans; a wide step's rows in parallel (a 16-row verify step's merge was
  // a tenth of the call on one thread), a few rows on the calling thread
  at::parallel_for(0, B * Hkv, 16, [&](int64_t first_bh, int64_t last_bh) {
    for (int64_t bh = first_bh; bh < last_bh; ++bh) {
      const int64_t b = bh / Hkv, h = bh % Hkv;
      // the row's own spans (those past its length are empty): a loop as long as the row's alone
      const int64_t own = (lens_p[b] + span - 1) / span;
      for (int g = 0; g < G; ++g) {
        const int64_t first = ((b * Hkv + h) * splits) * G + g;  // span 0 of this head, row g
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t sp = 0; sp < own; ++sp) m = std::max(m, ms[first + sp * G]);
        float w[kMaxSplits];
        float l = 0.f;
        for (int64_t sp = 0; sp < own; ++sp) {
          w[sp] = ls[first + sp * G] > 0.f ? std::exp(ms[first + sp * G] - m) : 0.f;
          l += w[sp] * ls[first + sp * G];
        }
        scalar_t* o = o_p + (b * H + h * G + g) * D;
#if KVSTRATA_AVX512  // 16 dims a pass, each lane's sum in the scalar loop's order
        for (int d0 = 0; d0 < D; d0 += 16) {
          __m512 x = _mm512_setzero_ps();
          for (int64_t sp = 0; sp < own; ++sp)
            x = _mm512_fmadd_ps(_mm512_set1_ps(w[sp]), _mm512_loadu_ps(&acc[(first + sp * G) * D + d0]), x);
          alignas(64) float xs[16];
          _mm512_store_ps(xs, x);
          for (int d = 0; d < 16; ++d) o[d0 + d] = static_cast<scalar_t>(xs[d] / l);
        }
#else
        for (int d = 0; d < D; ++d) {
          float x = 0.f;
          for (int64_t sp = 0; sp < own; ++sp) x += w[sp] * acc[(first + sp * G) * D + d];
          o[d] = static_cast<scalar_t>(x / l);
        }
#endif
      }
    }
  });
}

at::Tensor paged_decode(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                        const at::Tensor& pages, const at::Tensor& lens, int64_t page_size) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 3 && v_cache.dim() == 3, "q [B,H,D], caches [S,Hkv,D]");
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous(), "contiguous inputs");
  TORCH_CHECK(pages.scalar_type() == at::kLong && lens.scalar_type() == at::kLong, "int64 pages and lens");
  TORCH_CHECK(pages.is_contiguous() && lens.is_contiguous() && pages.size(0) == q.size(0), "pages [B,P]");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && q.scalar_type() == v_cache.scalar_type(), "one dtype");
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes(), "caches: one shape");
  const int64_t B = q.size(0), H = q.size(1), Hkv = k_cache.size(1), D = q.size(2);
  TORCH_CHECK(Hkv > 0 && H % Hkv == 0 && H / Hkv <= kMaxGroup, "query heads per KV head <= ", kMaxGroup);
  TORCH_CHECK(D == k_cache.size(2), "head dim");
  TORCH_CHECK(page_size >= 1 && lens.numel() == B, "page_size >= 1, lens [B]");
  auto out = at::empty_like(q);
  if (B == 0) return out;  // nothing to attend (and the span split below divides by B)
  // every page a row reads must lie in the pool (as rope_store checks its slots): a bad id reads out of bounds
  const int64_t num_pages = k_cache.size(0) / page_size, P = pages.size(1);
  const int64_t* lens_p = lens.data_ptr<int64_t>();
  const int64_t* pages_p = pages.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(lens_p[b] >= 1 && lens_p[b] <= P * page_size, "row ", b, ": length ", lens_p[b], " outside its pages");
    for (int64_t i = 0; i < (lens_p[b] + page_size - 1) / page_size; ++i) {
      const int64_t id = pages_p[b * P + i];
      TORCH_CHECK(id >= 0 && id < num_pages, "row ", b, ": page ", id, " outside the pool of ", num_pages, " pages");
    }
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_decode", [&] {
    switch (D) {
      case 16: paged_decode_impl<scalar_t, 16>(q, k_cache, v_cache, pages, lens, page_size, out); break;
      case 32: paged_decode_impl<scalar_t, 32>(q, k_cache, v_cache, pages, lens, page_size, out); break;
      case 64: paged_decode_impl<scalar_t, 64>(q, k_cache, v_cache, pages, lens, page_size, out); break;
      case 128: paged_decode_impl<scalar_t, 128>(q, k_cache, v_cache, pages, lens, page_size, out); break;
      case 256: paged_decode_impl<scalar_t, 256>(q, k_cache, v_cache, pages, lens, page_size, out); break;
      default: TORCH_CHECK(false, "head dim must be one of 16, 32, 64, 128, 256; got ", D);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(kvstrata, m) {
  m.def("paged_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor pages, Tensor lens, int page_size) -> Tensor");
}

TORCH_LIBRARY_IMPL(kvstrata, CPU, m) {
  m.impl("paged_decode", &paged_decode);
}
