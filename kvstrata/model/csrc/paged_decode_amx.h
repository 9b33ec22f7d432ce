// paged_decode.cpp's span step for a bf16 cache on AMX-BF16 tiles (Sapphire Rapids and later): both
// products of attention on tiles, a chunk of up to 256 tokens at a time. Included by paged_decode.cpp
// after its helpers (Partial, kMaxQueries).
//
// Why: a verify step gives one request 16 rows, so an item scores 48 queries (SmolLM2: 16 rows x 3 query
// heads a KV head) against each K row, then sums 48 weighted V rows. Scores alone on tiles leave the
// weighted sum to float32 FMAs (4 a query and token at D 64) and an online softmax rescale every 32
// tokens, the larger part of a drafted row's cost (docs/cpu-kernels.md, "Attention"). Here, per chunk:
//   K^T: the chunk's K rows turned to pairs of dims x 16 tokens (16x16 transposes of 32-bit pairs), and
//   V:   its token pairs interleaved (a B tile row: dims d..d+15 of tokens 2i and 2i + 1), both made once
//        for all of the item's queries;
//   per 16 queries: scores S = Q K^T (query-major, D / 32 tdpbf16ps a 16-token block; or, for a few
//   queries of a wide head, S^T = K Q^T off the K rows in place, transposed: scores_transposed), four
//   16-token blocks in flight on four accumulator tiles (a tile's products chain; four chains overlap), the
//   chunk's max and exp a query row at a time (one rescale a chunk, not a block), each weight split into
//   a bf16 high part and a bf16 rest (16 bits of it: weights rounded to bf16 alone, as GPU flash
//   attention feeds its PV product, took SmolLM2's bf16 greedy output from float32's in 4 more of 24
//   prompts), and P V = P_hi V + P_lo V on tiles into float32, four output tiles a pass. The two phases
//   load their own tile shapes. A query's first live chunk of a span writes its accumulator, so a span
//   starts without zeroing one.
// The chunk's operands (K^T, V pairs, slots, scratch) are made in paged_decode_amx_chunk.h.
// Every product is exact in float32 (bf16 x bf16) and each output row of a tile depends on its own A row
// alone, summed by the same instruction sequence whatever the other queries, so a query's bits do not
// depend on the step it is in (engine/spec/: greedy output the same with drafts). A verify row's tail
// tokens it must not see are -inf scores and zero weights against finite (or zeroed) V rows, not a
// shorter loop. Every step of a bf16 cache takes this form where AMX-BF16 is granted.
#pragma once

#if KVSTRATA_AMX_BF16

#include "paged_decode_amx_chunk.h"  // kChunk, SpanScratch, chunk_slots, chunk_kv, queries_t

// the scores of up to 4 blocks of 16 tokens from block b into S ([query][token]), 4 accumulator tiles in
// flight so that one tile's chain of KC products waits on the others, not on itself
template <int D>
void scores_amx(const c10::BFloat16* qa, int q0, int Qp, const c10::BFloat16* k, int64_t stride, const int64_t* slot,
                int n, int b, int nb, bool kt, SpanScratch<D>& sc) {
  using S = SpanScratch<D>;
#define KVSTRATA_FOR_BLOCKS(X) X(0) if (nb > 1) { X(1) } if (nb > 2) { X(2) } if (nb > 3) { X(3) }
  if (kt) {  // S = Q K^T: the queries' tile 4, K^T tile 5
#define KVSTRATA_ZERO(i) _tile_zero(i);
#define KVSTRATA_DOT(i) _tile_loadd(5, sc.kt + (size_t(b + i) * S::KC + c) * 256, 64); _tile_dpbf16ps(i, 4, 5);
#define KVSTRATA_STORE(i) _tile_stored(i, sc.s + (b + i) * 16, 4 * kChunk);
    KVSTRATA_FOR_BLOCKS(KVSTRATA_ZERO)
    for (int c = 0; c < S::KC; ++c) {
      _tile_loadd(4, qa + size_t(q0) * D + c * S::DC, 2 * D);
      KVSTRATA_FOR_BLOCKS(KVSTRATA_DOT)
    }
    KVSTRATA_FOR_BLOCKS(KVSTRATA_STORE)
    return;
  }
  // S^T = K Q^T: a block's K rows tile 4 (in place on one page, else gathered), the queries' pairs tile 5
  const c10::BFloat16* rows[4];
  int64_t rs[4];
  for (int i = 0; i < nb; ++i) {
    const int j0 = (b + i) * 16;
    rows[i] = k + slot[j0] * stride;
    rs[i] = stride;
    if (j0 + 16 > n || slot[j0 + 15] != slot[j0] + 15) {  // past n, or over a page's end: gathered, zeros past n
      uint16_t* kb = sc.kb + size_t(i) * 16 * D;
      for (int j = 0; j < 16; ++j) {
        if (j0 + j < n)
          std::memcpy(kb + size_t(j) * D, k + slot[j0 + j] * stride, 2 * D);
        else
          std::memset(kb + size_t(j) * D, 0, 2 * D);
      }
      rows[i] = reinterpret_cast<const c10::BFloat16*>(kb);
      rs[i] = D;
    }
  }
#define KVSTRATA_DOT_T(i) _tile_loadd(4, rows[i] + c * S::DC, 2 * rs[i]); _tile_dpbf16ps(i, 4, 5);
#define KVSTRATA_STORE_T(i) _tile_stored(i, sc.st + (i) * 256, 64);
  KVSTRATA_FOR_BLOCKS(KVSTRATA_ZERO)
  for (int c = 0; c < S::KC; ++c) {
    _tile_loadd(5, sc.qt + (size_t(q0 / 16) * S::KC + c) * 256, 64);
    KVSTRATA_FOR_BLOCKS(KVSTRATA_DOT_T)
  }
  KVSTRATA_FOR_BLOCKS(KVSTRATA_STORE_T)
  for (int i = 0; i < nb; ++i) {
    __m512i r[16];
    for (int j = 0; j < 16; ++j) r[j] = _mm512_load_si512(sc.st + i * 256 + j * 16);
    transpose16(r);
    for (int q = 0; q < Qp; ++q) _mm512_storeu_si512(sc.s + size_t(q) * kChunk + (b + i) * 16, r[q]);
  }
#undef KVSTRATA_FOR_BLOCKS
#undef KVSTRATA_ZERO
#undef KVSTRATA_DOT
#undef KVSTRATA_STORE
#undef KVSTRATA_DOT_T
#undef KVSTRATA_STORE_T
}

// Q queries (qa: [Q, D] bf16 rows) over the n tokens of slot[] (n <= kChunk; chunk_kv made its tiles), on
// top of out; query q sees the tokens before limit[q] - t0. A query's first live chunk of a span writes
// its accumulator (start_partial leaves it unset), later ones rescale and add
template <int D>
void attend_chunk_amx(const c10::BFloat16* qa, int Q, const int64_t* limit, const c10::BFloat16* k, int64_t stride,
                      const int64_t* slot, int64_t t0, int n, bool kt, float scale, const Partial& out,
                      SpanScratch<D>& sc, kvstrata::TileShapes& tiles) {
  using S = SpanScratch<D>;
  const int blocks = (n + 15) / 16, slices = (n + 31) / 32;
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity()), scv = _mm512_set1_ps(scale);
  for (int q0 = 0; q0 < Q; q0 += 16) {
    const int Qp = std::min(16, Q - q0);
    for (int t = 0; t < 4; ++t) tiles.set(t, kt ? Qp : 16, 64);  // scores: [query][16 tokens] or transposed
    tiles.set(4, kt ? Qp : 16, kt ? 2 * S::DC : 64);               // the queries (K^T), or a block's K rows
    tiles.set(5, S::DC / 2, 64);                                   // K^T, or the queries' pairs
    tiles.load();
    for (int b = 0; b < blocks; b += 4) scores_amx<D>(qa, q0, Qp, k, stride, slot, n, b, std::min(4, blocks - b), kt, sc);
    alignas(64) float fix[16];
    int live[16];
    bool first[16];
    for (int i = 0; i < Qp; ++i) {  // softmax, a query row at a time; weights to bf16
      const int q = q0 + i;
      live[i] = static_cast<int>(std::clamp<int64_t>(limit[q] - t0, 0, n));
      first[i] = *out.m[q] == -std::numeric_limits<float>::infinity();
      float* s = sc.s + size_t(i) * kChunk;
      uint16_t* p = sc.p + size_t(i) * kChunk;
      uint16_t* pl = sc.p_lo + size_t(i) * kChunk;
      const int nl = live[i];
      const auto first = [](int left) {  // lanes of a 16-token vector that hold tokens the query sees
        return left >= 16 ? __mmask16(0xffff) : left <= 0 ? __mmask16(0) : static_cast<__mmask16>((1u << left) - 1);
      };
      __m512 mx = ninf;
      for (int j = 0; j < nl; j += 16) mx = _mm512_mask_max_ps(mx, first(nl - j), mx, _mm512_loadu_ps(s + j));
      int j = 0;
      if (nl) {
        // the largest scaled score: the largest score scaled (scale > 0 keeps the order, rounding too)
        const float m_old = *out.m[q], m_new = std::max(m_old, _mm512_reduce_max_ps(mx) * scale);
        const __m512 mv = _mm512_set1_ps(m_new), top = _mm512_castsi512_ps(_mm512_set1_epi32(int32_t(0xffff0000u)));
        __m512 sum = _mm512_setzero_ps();
        for (; j < nl; j += 32) {  // w = hi + lo, both bf16 (hi: w's top 16 bits): 16 bits of w, not bf16's 8
          const __m512 w0 = _mm512_maskz_mov_ps(first(nl - j), exp_nonpositive(
                                                    _mm512_fmsub_ps(_mm512_loadu_ps(s + j), scv, mv)));
          const __m512 w1 = _mm512_maskz_mov_ps(first(nl - j - 16), exp_nonpositive(
                                                    _mm512_fmsub_ps(_mm512_loadu_ps(s + j + 16), scv, mv)));
          const __m512 h0 = _mm512_and_ps(w0, top), h1 = _mm512_and_ps(w1, top);
          _mm512_storeu_si512(p + j, (__m512i)_mm512_cvtne2ps_pbh(h1, h0));  // exact: h is a bf16 value
          _mm512_storeu_si512(pl + j, (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(w1, h1), _mm512_sub_ps(w0, h0)));
          sum = _mm512_add_ps(sum, _mm512_add_ps(w0, w1));
        }
        fix[i] = m_old == -std::numeric_limits<float>::infinity() ? 0.f : exp_nonpositive(m_old - m_new);
        *out.m[q] = m_new;
        *out.l[q] = *out.l[q] * fix[i] + _mm512_reduce_add_ps(sum);
      }
      for (; j < slices * 32; j += 32) {
        _mm512_storeu_si512(p + j, _mm512_setzero_si512());
        _mm512_storeu_si512(pl + j, _mm512_setzero_si512());
      }
    }
    // P V = P_hi V + P_lo V, 4 output tiles (16 dims each) a pass over the weights: outputs 0-3, the
    // weights' high part 4 and rest 5, V pairs 6
    for (int t = 0; t < 6; ++t) tiles.set(t, Qp, 64);
    tiles.set(6, 16, 64);
    tiles.load();
    for (int d0 = 0; d0 < S::VC; d0 += 4) {
      const int nt = std::min(4, S::VC - d0);
#define KVSTRATA_FOR_OUT(X) X(0) if (nt > 1) { X(1) } if (nt > 2) { X(2) } if (nt > 3) { X(3) }
#define KVSTRATA_ZERO(i) _tile_zero(i);
#define KVSTRATA_PV(i) _tile_loadd(6, vs + (i) * 16 * 32, 64); _tile_dpbf16ps(i, 4, 6); _tile_dpbf16ps(i, 5, 6);
#define KVSTRATA_STORE(i) _tile_stored(i, sc.c + (d0 + i) * 16, 4 * D);
      KVSTRATA_FOR_OUT(KVSTRATA_ZERO)
      for (int s = 0; s < slices; ++s) {
        _tile_loadd(4, sc.p + s * 32, 2 * kChunk);
        _tile_loadd(5, sc.p_lo + s * 32, 2 * kChunk);
        const uint16_t* vs = sc.vp + (size_t(s) * S::VC + d0) * 16 * 32;
        KVSTRATA_FOR_OUT(KVSTRATA_PV)
      }
      KVSTRATA_FOR_OUT(KVSTRATA_STORE)
#undef KVSTRATA_FOR_OUT
#undef KVSTRATA_ZERO
#undef KVSTRATA_PV
#undef KVSTRATA_STORE
    }
    for (int i = 0; i < Qp; ++i) {  // acc = acc * fix + P V; a query that saw none of the chunk keeps its state
      if (!live[i]) continue;
      float* acc = out.acc[q0 + i];
      const float* pv = sc.c + size_t(i) * D;
      const __m512 f = _mm512_set1_ps(fix[i]);
      for (int d = 0; d < D; d += 16)
        _mm512_storeu_ps(acc + d, first[i] ? _mm512_loadu_ps(pv + d)
                                           : _mm512_fmadd_ps(_mm512_loadu_ps(acc + d), f, _mm512_loadu_ps(pv + d)));
    }
  }
}

// Q queries over tokens [begin, end) of one KV head, a chunk at a time (chunks at fixed offsets from the
// span's start, so a row's chunks are the same in any step)
template <int D>
void attend_span_amx(const c10::BFloat16* qa, int Q, const int64_t* limit, const c10::BFloat16* k,
                     const c10::BFloat16* v, int64_t stride, const int64_t* pages, int64_t page_size, int64_t begin,
                     int64_t end, float scale, const Partial& out, SpanScratch<D>& sc, kvstrata::TileShapes& tiles,
                     const c10::BFloat16* whole_k = nullptr, const c10::BFloat16* whole_v = nullptr,
                     int64_t whole_bytes = 0) {
  const bool kt = !scores_transposed<D>(Q);
  if (!kt) queries_t<D>(qa, Q, sc);
  int64_t slot[kChunk];
  for (int64_t t0 = begin; t0 < end; t0 += kChunk) {
    const int n = static_cast<int>(std::min<int64_t>(kChunk, end - t0));
    chunk_slots(pages, page_size, t0, n, slot);
    chunk_kv<D>(k, v, stride, slot, n, kt, whole_k, whole_v, whole_bytes, sc);
    attend_chunk_amx<D>(qa, Q, limit, k, stride, slot, t0, n, kt, scale, out, sc, tiles);
  }
}

#endif
