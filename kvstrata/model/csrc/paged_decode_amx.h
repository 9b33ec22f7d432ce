// paged_decode.cpp's block step for a bf16 cache on AMX-BF16 tiles (Sapphire Rapids and later): the
// block's scores for all of an item's queries in a few tdpbf16ps, then the online softmax with a lane a
// query. Included by paged_decode.cpp after its helpers (kBlock, kMaxQueries, Partial, load_row,
// weighted_rows).
//
// Why: a verify step gives one request 16 rows, so an item scores 48 queries (SmolLM2: 16 rows x 3 query
// heads a KV head) against each K row. In float32 FMAs a (query, token) score is 4 FMAs and a horizontal
// sum (a third of a 16-row verify step's time went to attention, most of it there). On tiles the K rows
// are A as they lie (16 tokens x 32 dims, a row each) and the queries B (pairs of dims x queries, made once
// an item), so a tile of 16 tokens x 16 queries takes D / 32 tdpbf16ps. The products are exact in float32
// (bf16 x bf16) and every score is summed by the same instruction sequence whatever the other queries,
// so a query's bits do not depend on the step it is in (engine/spec/: greedy output the same with drafts):
// a verify row's tail tokens it must not see are -inf scores and zero weights (x + 0 = x), not a shorter
// loop. The scores are scaled after the sum (for D 16, 64, 256 a power of two: the same as scaling q).
// Every step of a bf16 cache takes this form where AMX-BF16 is granted, so a row's bits are this form's.
#pragma once

#if KVSTRATA_AMX_BF16

// the queries of one KV head as B tiles: qt[p * kMaxQueries + q] holds dims 2p, 2p + 1 of query q
template <int D>
inline void queries_as_pairs(const c10::BFloat16* const* rows, int Q, uint32_t* qt) {
  for (int q = 0; q < Q; ++q) {
    const uint32_t* r = reinterpret_cast<const uint32_t*>(rows[q]);
    for (int p = 0; p < D / 2; ++p) qt[p * kMaxQueries + q] = r[p];
  }
}

// out[i] *= f for D floats
template <int D>
inline void scale_row(float* out, float f) {
  const __m512 v = _mm512_set1_ps(f);
  for (int c = 0; c < D; c += 16) _mm512_storeu_ps(out + c, _mm512_mul_ps(_mm512_loadu_ps(out + c), v));
}

// Q queries (qt: queries_as_pairs) over the n tokens from t0 of one KV head, on top of out; query q sees
// the tokens before limit[q]. tiles: this thread's (0, 1: scores of tokens 0-15, 16-31 [16 x Qp];
// 2: 16 K rows [16 x 32 dims]; 3: the queries' dims [16 pairs x Qp])
template <int D>
void attend_block_amx(const uint32_t* qt, int Q, const int64_t* limit, const c10::BFloat16* k, const c10::BFloat16* v,
                      int64_t hkv_stride, const int64_t* pages, int64_t page_size, int64_t t0, int n, float scale,
                      const Partial& out, kvstrata::TileShapes& tiles) {
  constexpr int DC = D < 32 ? D : 32;  // dims a tile's row holds (64 bytes of bf16)
  alignas(64) c10::BFloat16 kb[kBlock][D];  // the block's K rows, zeros past n
  alignas(64) float st[kBlock][kMaxQueries];  // scores, then weights: token-major, a query a column
  for (int j = 0; j < kBlock; ++j) {
    if (j < n) {
      const int64_t t = t0 + j;
      std::memcpy(kb[j], k + (pages[t / page_size] * page_size + t % page_size) * hkv_stride, D * sizeof(c10::BFloat16));
    } else {
      std::memset(kb[j], 0, D * sizeof(c10::BFloat16));
    }
  }
  for (int q0 = 0; q0 < Q; q0 += 16) {  // scores
    const int Qp = std::min(16, Q - q0);
    tiles.set(0, 16, 4 * Qp);
    tiles.set(1, 16, 4 * Qp);
    tiles.set(2, 16, 2 * DC);
    tiles.set(3, DC / 2, 4 * Qp);
    tiles.load();
    _tile_zero(0);
    _tile_zero(1);
    for (int c = 0; c < D; c += DC) {
      _tile_loadd(3, qt + (c / 2) * kMaxQueries + q0, 4 * kMaxQueries);
      _tile_loadd(2, &kb[0][c], 2 * D);
      _tile_dpbf16ps(0, 2, 3);
      if (n > 16) {
        _tile_loadd(2, &kb[16][c], 2 * D);
        _tile_dpbf16ps(1, 2, 3);
      }
    }
    _tile_stored(0, &st[0][q0], 4 * kMaxQueries);
    if (n > 16) _tile_stored(1, &st[16][q0], 4 * kMaxQueries);
  }
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity()), sc = _mm512_set1_ps(scale);
  for (int q0 = 0; q0 < Q; q0 += 16) {  // online softmax, 16 queries a vector
    const int Qp = std::min(16, Q - q0);
    alignas(64) float mo[16] = {}, lo[16] = {}, fix[16];
    alignas(64) int32_t lv[16] = {};
    for (int i = 0; i < Qp; ++i) {
      mo[i] = *out.m[q0 + i];
      lo[i] = *out.l[q0 + i];
      lv[i] = static_cast<int32_t>(std::clamp<int64_t>(limit[q0 + i] - t0, 0, n));
    }
    const __m512 m_old = _mm512_load_ps(mo);
    const __m512i live = _mm512_load_si512(lv);
    __m512 mx = m_old;
    for (int j = 0; j < n; ++j) {
      const __mmask16 sees = _mm512_cmpgt_epi32_mask(live, _mm512_set1_epi32(j));
      const __m512 s = _mm512_mask_mul_ps(ninf, sees, _mm512_loadu_ps(&st[j][q0]), sc);
      _mm512_storeu_ps(&st[j][q0], s);
      mx = _mm512_max_ps(mx, s);
    }
    // a query that sees none of the block keeps its state (its max may still be -inf: no exp of it)
    const __mmask16 seen = _mm512_cmpgt_epi32_mask(live, _mm512_setzero_si512());
    const __m512 rescale = _mm512_mask_blend_ps(seen, _mm512_set1_ps(1.f),
                                                kvstrata::exp_nonpositive(_mm512_maskz_sub_ps(seen, m_old, mx)));
    __m512 sum = _mm512_setzero_ps();
    for (int j = 0; j < n; ++j) {
      const __mmask16 sees = _mm512_cmpgt_epi32_mask(live, _mm512_set1_epi32(j));
      const __m512 e = _mm512_maskz_mov_ps(sees, kvstrata::exp_nonpositive(
                                                     _mm512_maskz_sub_ps(sees, _mm512_loadu_ps(&st[j][q0]), mx)));
      _mm512_storeu_ps(&st[j][q0], e);
      sum = _mm512_add_ps(sum, e);
    }
    _mm512_store_ps(mo, _mm512_mask_blend_ps(seen, m_old, mx));
    _mm512_store_ps(lo, _mm512_fmadd_ps(_mm512_load_ps(lo), rescale, sum));
    _mm512_store_ps(fix, rescale);
    for (int i = 0; i < Qp; ++i) {
      *out.m[q0 + i] = mo[i];
      *out.l[q0 + i] = lo[i];
      if (fix[i] != 1.f) scale_row<D>(out.acc[q0 + i], fix[i]);
    }
  }
  alignas(64) float buf[kBlock][D];  // the block's V rows as floats
  const float* rows[kBlock];
  for (int j = 0; j < n; ++j) rows[j] = load_row<c10::BFloat16, D>(v, pages, page_size, hkv_stride, t0 + j, buf[j]);
  constexpr int NQ = D <= 64 ? 4 : D == 128 ? 2 : 1;  // NQ x D / 16 <= 16 accumulators
  int q = 0;
  for (; q + NQ <= Q; q += NQ) weighted_rows<D, NQ>(&st[0][q], kMaxQueries, 1, rows, n, &out.acc[q]);
  if constexpr (NQ == 4) {  // three left (a 1-row step of 3 query heads a KV head): one pass for them
    if (Q - q == 3) {
      weighted_rows<D, 3>(&st[0][q], kMaxQueries, 1, rows, n, &out.acc[q]);
      return;
    }
  }
  for (; q < Q; ++q) weighted_rows<D, 1>(&st[0][q], kMaxQueries, 1, rows, n, &out.acc[q]);
}

#endif
