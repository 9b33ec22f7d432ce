// paged_decode_amx.h's chunk operands: a chunk's K and V turned into AMX B tiles (K^T as pairs of dims x
// tokens, V as interleaved token pairs), the queries' pairs for transposed scores, the chunk's slots, and the
// per-thread scratch that holds them. Included by paged_decode_amx.h inside KVSTRATA_AMX_BF16.
#pragma once

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
  static constexpr size_t kKb = size_t(4) * 16 * D;                 // bf16: 4 blocks' K rows gathered
  static constexpr size_t kSt = 4 * 16 * 16;                        // float: 4 blocks' scores, [token][query]
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
// transposed, one transpose a block a 16 queries. The second only where the queries fit one tile and the
// head is wide (a one-row step at head size 128: 1 transpose a block, not 4): with two or more 16-query
// groups each group loads the K rows again, strided across the slots, where K^T reads them once (the
// figures: docs/cpu-kernels.md, "Attention").
template <int D>
constexpr bool scores_transposed(int Q) {
  return SpanScratch<D>::DC == 32 && SpanScratch<D>::KC > 1 && Q <= 16;
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

// the chunk's slots: slot[j] holds token t0 + j (one division a page, not a row)
inline void chunk_slots(const int64_t* pages, int64_t page_size, int64_t t0, int n, int64_t* slot) {
  for (int j = 0; j < n;) {
    const int64_t t = t0 + j, base = pages[t / page_size] * page_size, off = t % page_size;
    const int m = static_cast<int>(std::min<int64_t>(page_size - off, n - j));
    for (int i = 0; i < m; ++i) slot[j + i] = base + off + i;
    j += m;
  }
}

// the rows of tokens [j0, j1) of a chunk: `bytes` from `cache` in each token's slot, into L1 (kHint
// _MM_HINT_T0) or L2 (_MM_HINT_T1)
template <int kHint>
inline void prefetch_rows(const c10::BFloat16* cache, const int64_t* slot, int64_t stride, int j0, int j1, int64_t bytes) {
  for (int j = j0; j < j1; ++j) {
    const char* row = reinterpret_cast<const char*>(cache + slot[j] * stride);
    for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(row + off, static_cast<_mm_hint>(kHint));
  }
}

// the chunk's K as B tiles (pairs of dims x tokens) and V as B tiles (token pairs x dims, interleaved);
// tokens past n are zeros. Each token's head row is 2 D bytes of a slot that holds every KV head: the
// rows of the next 16 tokens are prefetched while these are turned, since a strided walk defeats the
// hardware's stream prefetch
template <int D>
void chunk_kv(const c10::BFloat16* k, const c10::BFloat16* v, int64_t stride, const int64_t* slot, int n, bool kt,
              const c10::BFloat16* whole_k, const c10::BFloat16* whole_v, int64_t whole_bytes, SpanScratch<D>& sc) {
  using S = SpanScratch<D>;
  // the first head of an item brings the item's heads' rows (whole_bytes from whole_k / whole_v in each slot)
  // of the tokens 32-64 ahead into L2, one sequential read the other heads then find there
  const auto ahead_l2 = [&](const c10::BFloat16* whole, const c10::BFloat16* own, int j0) {
    prefetch_rows<_MM_HINT_T1>(whole ? whole : own, slot, stride, j0, std::min(j0 + 32, n), whole ? whole_bytes : 2 * D);
  };
  const __mmask16 pairs = static_cast<__mmask16>((1u << (S::DC / 2)) - 1);
  if (kt && whole_k) ahead_l2(whole_k, k, 0);
  for (int b = 0; kt && b * 16 < n; ++b) {
    if (b % 2 == 0 && whole_k) ahead_l2(whole_k, k, b * 16 + 32);
    prefetch_rows<_MM_HINT_T0>(k, slot, stride, b * 16 + 16, std::min(b * 16 + 32, n), 2 * D);
    for (int c = 0; c < S::KC; ++c) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i)
        r[i] = b * 16 + i < n ? _mm512_maskz_loadu_epi32(pairs, k + slot[b * 16 + i] * stride + c * S::DC)
                              : _mm512_setzero_si512();
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
  if (whole_v) ahead_l2(whole_v, v, 0);
  for (int s = 0; s * 32 < n; ++s) {
    if (whole_v) ahead_l2(whole_v, v, s * 32 + 32);
    if (!kt) ahead_l2(whole_k, k, s * 32);  // K rows the scores read in place, later
    prefetch_rows<_MM_HINT_T0>(v, slot, stride, s * 32 + 32, std::min(s * 32 + 64, n), 2 * D);
    for (int tp = 0; tp < 16; ++tp) {
      const int j = s * 32 + 2 * tp;
      const c10::BFloat16* ra = j < n ? v + slot[j] * stride : nullptr;
      const c10::BFloat16* re = j + 1 < n ? v + slot[j + 1] * stride : nullptr;
      for (int d = 0; d < D; d += W) {
        const __m512i a = ra ? _mm512_maskz_loadu_epi16(dims, ra + d) : _mm512_setzero_si512();
        const __m512i e = re ? _mm512_maskz_loadu_epi16(dims, re + d) : _mm512_setzero_si512();
        uint16_t* dst = sc.vp + ((size_t(s) * S::VC + d / 16) * 16 + tp) * 32;
        _mm512_store_si512(dst, _mm512_permutex2var_epi16(a, lo, e));
        if (W == 32) _mm512_store_si512(dst + 16 * 32, _mm512_permutex2var_epi16(a, hi, e));
      }
    }
  }
}
