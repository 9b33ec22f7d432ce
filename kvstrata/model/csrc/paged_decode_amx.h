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
//   queries of a wide head, S^T = K Q^T off the K rows in place, transposed: scores_transposed), the
//   chunk's max and exp a query row at a time (one rescale a chunk, not a block), each weight split into
//   a bf16 high part and a bf16 rest (16 bits of it: weights rounded to bf16 alone, as GPU flash
//   attention feeds its PV product, took SmolLM2's bf16 greedy output from float32's in 4 more of 24
//   prompts), and P V = P_hi V + P_lo V on tiles into float32.
// Every product is exact in float32 (bf16 x bf16) and each output row of a tile depends on its own A row
// alone, summed by the same instruction sequence whatever the other queries, so a query's bits do not
// depend on the step it is in (engine/spec/: greedy output the same with drafts). A verify row's tail
// tokens it must not see are -inf scores and zero weights against finite (or zeroed) V rows, not a
// shorter loop. Every step of a bf16 cache takes this form where AMX-BF16 is granted.
#pragma once

#if KVSTRATA_AMX_BF16

constexpr int kChunk = 256;  // tokens a chunk: its scores and weights held whole for one softmax

// 16 rows of 16 32-bit values transposed in registers (4 rounds of 16 shuffles)
inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // r[i + e] lane l: element 4l + e of rows i .. i + 3
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int e = 0; e < 4; ++e) {  // lanes (0, 2) and (1, 3) of rows' quarters 0-1 and 2-3
    t[e] = _mm512_shuffle_i32x4(r[e], r[4 + e], 0x88);
    t[4 + e] = _mm512_shuffle_i32x4(r[e], r[4 + e], 0xdd);
    t[8 + e] = _mm512_shuffle_i32x4(r[8 + e], r[12 + e], 0x88);
    t[12 + e] = _mm512_shuffle_i32x4(r[8 + e], r[12 + e], 0xdd);
  }
  for (int e = 0; e < 8; ++e) {
    r[e] = _mm512_shuffle_i32x4(t[e], t[8 + e], 0x88);
    r[8 + e] = _mm512_shuffle_i32x4(t[e], t[8 + e], 0xdd);
  }
}

// one thread's chunk buffers for head size D (64-byte aligned)
template <int D>
struct SpanScratch {
  static constexpr int DC = D < 32 ? D : 32;  // dims of a score tile's K (64 bytes of bf16)
  static constexpr int KC = D / DC;           // score tiles a 16-token block
  static constexpr int VC = D / 16;           // output tiles (16 dims each)
  static constexpr size_t kKt = size_t(kChunk / 16) * KC * 16 * 16;  // uint32: [block][KC][pair][token]
  static constexpr size_t kVp = size_t(kChunk / 32) * VC * 16 * 32;  // bf16: [slice][VC][token pair][32]
  static constexpr size_t kS = size_t(16) * kChunk;                 // float: [query][token]
  static constexpr size_t kP = size_t(16) * kChunk;                 // bf16: [query][token], a high part and the rest
  static constexpr size_t kC = size_t(16) * D;                      // float: [query][dim]
  static constexpr size_t kQt = size_t(kMaxQueries / 16) * KC * 16 * 16;  // uint32: [16-query group][KC][pair][query]
  static constexpr size_t kKb = size_t(16) * D;                     // bf16: a block's K rows gathered
  static constexpr size_t kSt = 16 * 16;                            // float: a block's scores, [token][query]
  std::unique_ptr<uint8_t[]> raw{
      new uint8_t[4 * kKt + 2 * kVp + 4 * kS + 4 * kP + 4 * kC + 4 * kQt + 2 * kKb + 4 * kSt + 64]};
  uint32_t* kt = reinterpret_cast<uint32_t*>((reinterpret_cast<uintptr_t>(raw.get()) + 63) & ~uintptr_t(63));
  uint16_t* vp = reinterpret_cast<uint16_t*>(kt + kKt);
  float* s = reinterpret_cast<float*>(vp + kVp);
  uint16_t* p = reinterpret_cast<uint16_t*>(s + kS);
  uint16_t* p_lo = p + kP;
  float* c = reinterpret_cast<float*>(p_lo + kP);
  uint32_t* qt = reinterpret_cast<uint32_t*>(c + kC);
  float* st = reinterpret_cast<float*>(qt + kQt);
  uint16_t* kb = reinterpret_cast<uint16_t*>(st + kSt);
};

// Which way a span's scores are made (the same bits either way: a tile element sums the same products of
// the same bf16 pairs in the same order whichever operand is A). K^T: the chunk's K rows transposed once
// for all the item's queries, KC transposes a 16-token block. Scores transposed: K rows are A tiles read in
// place and the queries, transposed once a span, the B tile; each 16-token block's 16 x 16 scores are then
// transposed, one transpose a block a 16 queries. The second where the queries are few and the head wide
// (a one-row step at head size 128: 1 transpose a block, not 4).
template <int D>
constexpr bool scores_transposed(int Q) {
  return SpanScratch<D>::DC == 32 && (Q + 15) / 16 < SpanScratch<D>::KC;
}

// the queries' bf16 pairs as B tiles, 16 queries a tile (zeros past Q): [group][c][pair][query]
template <int D>
void queries_t(const c10::BFloat16* qa, int Q, SpanScratch<D>& sc) {
  using S = SpanScratch<D>;
  for (int g = 0; g * 16 < Q; ++g) {
    for (int c = 0; c < S::KC; ++c) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i)
        r[i] = g * 16 + i < Q ? _mm512_loadu_si512(qa + size_t(g * 16 + i) * D + c * S::DC) : _mm512_setzero_si512();
      transpose16(r);
      for (int p = 0; p < 16; ++p) _mm512_store_si512(sc.qt + ((size_t(g) * S::KC + c) * 16 + p) * 16, r[p]);
    }
  }
}

// the chunk's K as B tiles (pairs of dims x tokens) and V as B tiles (token pairs x dims, interleaved);
// tokens past n are zeros
template <int D>
void chunk_kv(const c10::BFloat16* k, const c10::BFloat16* v, int64_t stride, const int64_t* pages, int64_t page_size,
              int64_t t0, int n, bool kt, SpanScratch<D>& sc) {
  using S = SpanScratch<D>;
  const __mmask16 pairs = static_cast<__mmask16>((1u << (S::DC / 2)) - 1);
  const auto row = [&](const c10::BFloat16* cache, int j) { return slot_row(cache, pages, page_size, stride, t0 + j); };
  for (int b = 0; kt && b * 16 < n; ++b) {
    for (int c = 0; c < S::KC; ++c) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i)
        r[i] = b * 16 + i < n ? _mm512_maskz_loadu_epi32(pairs, row(k, b * 16 + i) + c * S::DC) : _mm512_setzero_si512();
      transpose16(r);
      uint32_t* dst = sc.kt + (size_t(b) * S::KC + c) * 256;
      for (int p = 0; p < S::DC / 2; ++p) _mm512_store_si512(dst + p * 16, r[p]);
    }
  }
  // a B row of a 16-dim piece: dims d..d+15 of tokens 2i and 2i + 1, interleaved
  alignas(64) static constexpr int16_t kLo[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                                  8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static constexpr int16_t kHi[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                                  24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const __m512i lo = _mm512_load_si512(kLo), hi = _mm512_load_si512(kHi);
  constexpr int W = D < 32 ? D : 32;  // dims a load takes
  const __mmask32 dims = static_cast<__mmask32>((uint64_t(1) << W) - 1);
  for (int s = 0; s * 32 < n; ++s) {
    for (int tp = 0; tp < 16; ++tp) {
      const int j = s * 32 + 2 * tp;
      for (int d = 0; d < D; d += W) {
        const __m512i a = j < n ? _mm512_maskz_loadu_epi16(dims, row(v, j) + d) : _mm512_setzero_si512();
        const __m512i e = j + 1 < n ? _mm512_maskz_loadu_epi16(dims, row(v, j + 1) + d) : _mm512_setzero_si512();
        uint16_t* dst = sc.vp + ((size_t(s) * S::VC + d / 16) * 16 + tp) * 32;
        _mm512_store_si512(dst, _mm512_permutex2var_epi16(a, lo, e));
        if (W == 32) _mm512_store_si512(dst + 16 * 32, _mm512_permutex2var_epi16(a, hi, e));
      }
    }
  }
}

// Q queries (qa: [Q, D] bf16 rows) over tokens [t0, t0 + n) of one KV head (n <= kChunk; chunk_kv made
// its tiles), on top of out; query q sees the tokens before limit[q]
template <int D>
void attend_chunk_amx(const c10::BFloat16* qa, int Q, const int64_t* limit, const c10::BFloat16* k, int64_t stride,
                      const int64_t* pages, int64_t page_size, int64_t t0, int n, bool kt, float scale,
                      const Partial& out, SpanScratch<D>& sc, kvstrata::TileShapes& tiles) {
  using S = SpanScratch<D>;
  const int blocks = (n + 15) / 16, slices = (n + 31) / 32;
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity()), scv = _mm512_set1_ps(scale);
  for (int q0 = 0; q0 < Q; q0 += 16) {
    const int Qp = std::min(16, Q - q0);
    for (int t : {0, 1, 3}) tiles.set(t, Qp, 64);  // outputs: scores (16 tokens), P V (16 dims)
    tiles.set(2, Qp, 64);                                // weights' rest (32 tokens)
    tiles.set(4, kt ? Qp : 16, kt ? 2 * S::DC : 64);     // queries (K^T), or a block's scores (transposed)
    tiles.set(5, S::DC / 2, 64);                         // K^T, or the queries' pairs
    tiles.set(6, Qp, 64);                                // weights' high part (32 tokens)
    tiles.set(7, 16, 64);                                // V pairs, or a block's K rows
    tiles.load();
    for (int b = 0; !kt && b < blocks; ++b) {  // S^T = K Q^T a block at a time, transposed into S
      const int64_t t = t0 + b * 16;
      const c10::BFloat16* rows = slot_row(k, pages, page_size, stride, t);
      int64_t rs = stride;
      if (t % page_size + 16 > page_size) {  // the block spans pages: its rows gathered (zeros past n)
        for (int j = 0; j < 16; ++j) {
          if (b * 16 + j < n)
            std::memcpy(sc.kb + size_t(j) * D, slot_row(k, pages, page_size, stride, t + j), 2 * D);
          else
            std::memset(sc.kb + size_t(j) * D, 0, 2 * D);
        }
        rows = reinterpret_cast<const c10::BFloat16*>(sc.kb);
        rs = D;
      }  // else in place; rows past n are slots of the block's page, their scores masked below
      _tile_zero(4);
      for (int c = 0; c < S::KC; ++c) {
        _tile_loadd(7, rows + c * S::DC, 2 * rs);
        _tile_loadd(5, sc.qt + (size_t(q0 / 16) * S::KC + c) * 256, 64);
        _tile_dpbf16ps(4, 7, 5);
      }
      _tile_stored(4, sc.st, 64);
      __m512i r[16];
      for (int i = 0; i < 16; ++i) r[i] = _mm512_load_si512(sc.st + i * 16);
      transpose16(r);
      for (int i = 0; i < Qp; ++i) _mm512_storeu_si512(sc.s + size_t(i) * kChunk + b * 16, r[i]);
    }
    for (int b = 0; kt && b < blocks; b += 2) {  // S = Q K^T, 32 tokens a pass
      const bool two = b + 1 < blocks;
      _tile_zero(0);
      _tile_zero(1);
      for (int c = 0; c < S::KC; ++c) {
        _tile_loadd(4, qa + size_t(q0) * D + c * S::DC, 2 * D);
        _tile_loadd(5, sc.kt + (size_t(b) * S::KC + c) * 256, 64);
        _tile_dpbf16ps(0, 4, 5);
        if (two) {
          _tile_loadd(5, sc.kt + (size_t(b + 1) * S::KC + c) * 256, 64);
          _tile_dpbf16ps(1, 4, 5);
        }
      }
      _tile_stored(0, sc.s + b * 16, 4 * kChunk);
      if (two) _tile_stored(1, sc.s + (b + 1) * 16, 4 * kChunk);
    }
    alignas(64) float fix[16];
    int live[16];
    for (int i = 0; i < Qp; ++i) {  // softmax, a query row at a time; weights to bf16
      const int q = q0 + i;
      live[i] = static_cast<int>(std::clamp<int64_t>(limit[q] - t0, 0, n));
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
    // P V = P_hi V + P_lo V, up to 4 output tiles a pass over the weights: 0, 1, 3 and 4 (the queries'
    // tile, the same shape where D >= 32; D 16 has one output tile; 3 a pass where tile 4 holds scores)
    const int per_pass = kt ? 4 : 3;
    for (int d0 = 0; d0 < S::VC; d0 += per_pass) {
      const int nt = std::min(per_pass, S::VC - d0);
      _tile_zero(0);
      if (nt > 1) _tile_zero(1);
      if (nt > 2) _tile_zero(3);
      if (nt > 3) _tile_zero(4);
      for (int s = 0; s < slices; ++s) {
        _tile_loadd(6, sc.p + s * 32, 2 * kChunk);
        _tile_loadd(2, sc.p_lo + s * 32, 2 * kChunk);
        const uint16_t* vs = sc.vp + (size_t(s) * S::VC + d0) * 16 * 32;
        _tile_loadd(7, vs, 64);
        _tile_dpbf16ps(0, 6, 7);
        _tile_dpbf16ps(0, 2, 7);
        if (nt > 1) {
          _tile_loadd(7, vs + 16 * 32, 64);
          _tile_dpbf16ps(1, 6, 7);
          _tile_dpbf16ps(1, 2, 7);
        }
        if (nt > 2) {
          _tile_loadd(7, vs + 2 * 16 * 32, 64);
          _tile_dpbf16ps(3, 6, 7);
          _tile_dpbf16ps(3, 2, 7);
        }
        if (nt > 3) {
          _tile_loadd(7, vs + 3 * 16 * 32, 64);
          _tile_dpbf16ps(4, 6, 7);
          _tile_dpbf16ps(4, 2, 7);
        }
      }
      _tile_stored(0, sc.c + d0 * 16, 4 * D);
      if (nt > 1) _tile_stored(1, sc.c + (d0 + 1) * 16, 4 * D);
      if (nt > 2) _tile_stored(3, sc.c + (d0 + 2) * 16, 4 * D);
      if (nt > 3) _tile_stored(4, sc.c + (d0 + 3) * 16, 4 * D);
    }
    for (int i = 0; i < Qp; ++i) {  // acc = acc * fix + P V; a query that saw none of the chunk keeps its state
      if (!live[i]) continue;
      float* acc = out.acc[q0 + i];
      const float* pv = sc.c + size_t(i) * D;
      const __m512 f = _mm512_set1_ps(fix[i]);
      for (int d = 0; d < D; d += 16)
        _mm512_storeu_ps(acc + d, _mm512_fmadd_ps(_mm512_loadu_ps(acc + d), f, _mm512_loadu_ps(pv + d)));
    }
  }
}

// Q queries over tokens [begin, end) of one KV head, a chunk at a time (chunks at fixed offsets from the
// span's start, so a row's chunks are the same in any step)
template <int D>
void attend_span_amx(const c10::BFloat16* qa, int Q, const int64_t* limit, const c10::BFloat16* k,
                     const c10::BFloat16* v, int64_t stride, const int64_t* pages, int64_t page_size, int64_t begin,
                     int64_t end, float scale, const Partial& out, SpanScratch<D>& sc, kvstrata::TileShapes& tiles) {
  const bool kt = !scores_transposed<D>(Q);
  if (!kt) queries_t<D>(qa, Q, sc);
  for (int64_t t0 = begin; t0 < end; t0 += kChunk) {
    const int n = static_cast<int>(std::min<int64_t>(kChunk, end - t0));
    chunk_kv<D>(k, v, stride, pages, page_size, t0, n, kt, sc);
    attend_chunk_amx<D>(qa, Q, limit, k, stride, pages, page_size, t0, n, kt, scale, out, sc, tiles);
  }
}

#endif
