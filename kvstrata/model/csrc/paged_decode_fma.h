// paged_decode.cpp's span step in float32 FMAs (AVX-512, AVX2, or the compiler's own loops): a block of
// kBlock tokens of one KV head at a time, K/V rows read in place (a float32 cache) or converted, scores for
// the item's query rows, an online softmax, the weighted sum of V. Every cache and CPU takes it where the
// AMX form (paged_decode_amx.h) does not. Also the span state both forms share (Partial, start_partial).
// Included by paged_decode.cpp inside its namespace, after its constants (kBlock, kMaxGroup, kMaxQueries)
// and the KVSTRATA_AVX2 / KVSTRATA_AVX512 switches.
#pragma once

template <typename T>
inline float to_float(T x) { return static_cast<float>(x); }

template <>
inline float to_float(c10::BFloat16 x) {  // the high half of a float: a shift the compiler vectorizes
  const uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// token t's row (one KV head) of a paged cache: its page's slot, rows `stride` values apart
template <typename scalar_t>
inline const scalar_t* slot_row(const scalar_t* cache, const int64_t* pages, int64_t page_size, int64_t stride,
                                int64_t t) {
  return cache + (pages[t / page_size] * page_size + t % page_size) * stride;
}

// token t's row (one KV head, D values) of a paged cache, as floats: in place for a float cache, else
// converted into buf
template <typename scalar_t, int D>
inline const float* load_row(const scalar_t* cache, const int64_t* pages, int64_t page_size, int64_t stride,
                             int64_t t, float* buf) {
  const scalar_t* row = slot_row(cache, pages, page_size, stride, t);
  if constexpr (std::is_same_v<scalar_t, float>) {
    return row;
  } else {
#pragma omp simd
    for (int d = 0; d < D; ++d) buf[d] = to_float(row[d]);
    return buf;
  }
}

#if KVSTRATA_AVX2
// q . k for a block of n tokens (rows: the block's keys as floats). Eight tokens at a time: each dot
// leaves an 8-lane vector of partial sums, and a tree of hadds turns the eight vectors into one
// vector of their eight sums (9 instructions instead of a horizontal sum per token).
template <int D>
inline void block_scores(const float* q, const float* const* rows, int n, float* out) {
  int j = 0;
  for (; j + 8 <= n; j += 8) {
    __m256 p[8];
    for (int t = 0; t < 8; ++t) {
#if KVSTRATA_AVX512
      // the same sums in 16 lanes: lanes 0-7 are a0's below, 8-15 a1's, so low + high half is a0 + a1
      // (the same bits in half the instructions)
      __m512 a = _mm512_setzero_ps();
      for (int c = 0; c < D; c += 16) a = _mm512_fmadd_ps(_mm512_loadu_ps(q + c), _mm512_loadu_ps(rows[j + t] + c), a);
      p[t] = _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
#else
      __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
      for (int c = 0; c < D; c += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), _mm256_loadu_ps(rows[j + t] + c), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + c + 8), _mm256_loadu_ps(rows[j + t] + c + 8), a1);
      }
      p[t] = _mm256_add_ps(a0, a1);
#endif
    }
    // hadd(a, b) = [a0+a1, a2+a3, b0+b1, b2+b3 | the same for lanes 4-7]: after two levels, lane i of the
    // low halves holds a quarter of p[i]'s sum and lane i of the high halves another, so one permute+add
    const __m256 b0 = _mm256_hadd_ps(_mm256_hadd_ps(p[0], p[1]), _mm256_hadd_ps(p[2], p[3]));
    const __m256 b1 = _mm256_hadd_ps(_mm256_hadd_ps(p[4], p[5]), _mm256_hadd_ps(p[6], p[7]));
    _mm256_storeu_ps(out + j, _mm256_add_ps(_mm256_permute2f128_ps(b0, b1, 0x20), _mm256_permute2f128_ps(b0, b1, 0x31)));
  }
  for (; j < n; ++j) {
    float dot = 0.f;
    for (int d = 0; d < D; ++d) dot += q[d] * rows[j][d];
    out[j] = dot;
  }
}

// acc += sum_j p[j] * rows[j], with acc held in registers across the block
template <int D>
inline void block_accumulate(const float* p, const float* const* rows, int n, float* acc) {
#if KVSTRATA_AVX512  // each lane's sum as in 8 lanes, in half the instructions
  __m512 a[D / 16];
  for (int c = 0; c < D / 16; ++c) a[c] = _mm512_loadu_ps(acc + 16 * c);
  for (int j = 0; j < n; ++j) {
    const __m512 w = _mm512_set1_ps(p[j]);
    for (int c = 0; c < D / 16; ++c) a[c] = _mm512_fmadd_ps(w, _mm512_loadu_ps(rows[j] + 16 * c), a[c]);
  }
  for (int c = 0; c < D / 16; ++c) _mm512_storeu_ps(acc + 16 * c, a[c]);
#else
  __m256 a[D / 8];
  for (int c = 0; c < D / 8; ++c) a[c] = _mm256_loadu_ps(acc + 8 * c);
  for (int j = 0; j < n; ++j) {
    const __m256 w = _mm256_set1_ps(p[j]);
    for (int c = 0; c < D / 8; ++c) a[c] = _mm256_fmadd_ps(w, _mm256_loadu_ps(rows[j] + 8 * c), a[c]);
  }
  for (int c = 0; c < D / 8; ++c) _mm256_storeu_ps(acc + 8 * c, a[c]);
#endif
}

#if KVSTRATA_AVX512
// block_accumulate for NQ queries at once over the same n rows (a verify group's queries): acc[i] +=
// sum_j p[i * kBlock + j] * rows[j], each row loaded once for all of them, and NQ x D / 16 independent sums
// where one query's D / 16 waited on the FMA latency token after token. A query's sums take the same FMAs
// in the same order whatever NQ: the same bits. p: query-major weights, kBlock a query.
template <int D, int NQ>
inline void weighted_rows(const float* p, const float* const* rows, int n, float* const* acc) {
  __m512 a[NQ][D / 16];
  for (int i = 0; i < NQ; ++i)
    for (int c = 0; c < D / 16; ++c) a[i][c] = _mm512_loadu_ps(acc[i] + 16 * c);
  for (int j = 0; j < n; ++j) {
    __m512 r[D / 16];
    for (int c = 0; c < D / 16; ++c) r[c] = _mm512_loadu_ps(rows[j] + 16 * c);
    for (int i = 0; i < NQ; ++i) {
      const __m512 w = _mm512_set1_ps(p[i * kBlock + j]);
      for (int c = 0; c < D / 16; ++c) a[i][c] = _mm512_fmadd_ps(w, r[c], a[i][c]);
    }
  }
  for (int i = 0; i < NQ; ++i)
    for (int c = 0; c < D / 16; ++c) _mm512_storeu_ps(acc[i] + 16 * c, a[i][c]);
}
#endif

// the largest of s[0..n) and m
inline float block_max(const float* s, int n, float m) {
  int j = 0;
  if (n >= 8) {
    __m256 v = _mm256_loadu_ps(s);
    for (j = 8; j + 8 <= n; j += 8) v = _mm256_max_ps(v, _mm256_loadu_ps(s + j));
    const __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 h2 = _mm_max_ps(h, _mm_movehl_ps(h, h));
    m = std::max(m, _mm_cvtss_f32(_mm_max_ss(h2, _mm_shuffle_ps(h2, h2, 1))));
  }
  for (; j < n; ++j) m = std::max(m, s[j]);
  return m;
}

// s[j] = exp(s[j] - m) for j < n; returns their sum
inline float block_exp(float* s, int n, float m) {
  int j = 0;
  __m256 sum8 = _mm256_setzero_ps();
  const __m256 mv = _mm256_set1_ps(m);
  for (; j + 8 <= n; j += 8) {
    const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
    _mm256_storeu_ps(s + j, e);
    sum8 = _mm256_add_ps(sum8, e);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum8);
  float sum = 0.f;
  for (int i = 0; i < 8; ++i) sum += lanes[i];
  for (; j < n; ++j) {
    s[j] = exp_nonpositive(s[j] - m);
    sum += s[j];
  }
  return sum;
}
#else
inline float block_max(const float* s, int n, float m) {
  for (int j = 0; j < n; ++j) m = std::max(m, s[j]);
  return m;
}

inline float block_exp(float* s, int n, float m) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j < n; ++j) {
    s[j] = exp_nonpositive(s[j] - m);
    sum += s[j];
  }
  return sum;
}

template <int D>
inline void block_scores(const float* q, const float* const* rows, int n, float* out) {
  for (int j = 0; j < n; ++j) {
    float dot = 0.f;
#pragma omp simd reduction(+ : dot)
    for (int d = 0; d < D; ++d) dot += q[d] * rows[j][d];
    out[j] = dot;
  }
}

template <int D>
inline void block_accumulate(const float* p, const float* const* rows, int n, float* acc) {
  alignas(64) float a[D];
  for (int d = 0; d < D; ++d) a[d] = acc[d];
  for (int j = 0; j < n; ++j) {
#pragma omp simd
    for (int d = 0; d < D; ++d) a[d] += p[j] * rows[j][d];
  }
  for (int d = 0; d < D; ++d) acc[d] = a[d];
}
#endif

struct Partial {  // one span's unnormalised result per query row: acc = sum p * v, l = sum p, m = max score
  float* acc[kMaxQueries];  // [D] each
  float* m[kMaxQueries];
  float* l[kMaxQueries];
};

// Before a span: no tokens seen (m = -inf, l = 0, acc = 0)
template <int D>
void start_partial(int Q, const Partial& out, bool zero_acc = true) {
  for (int q = 0; q < Q; ++q) {
    *out.m[q] = -std::numeric_limits<float>::infinity();
    *out.l[q] = 0.f;
    if (zero_acc)  // the AMX form writes a query's accumulator at its first live chunk instead
      for (int d = 0; d < D; ++d) out.acc[q][d] = 0.f;
  }
}

// Q query rows (qf: [Q, D], scaled) over the n tokens from t0 of one KV head, on top of out; query q
// sees the tokens before limit[q] (its row's length), so a group's shorter rows skip the tail they must
// not see.
template <typename scalar_t, int D>
void attend_block(const float* qf, int Q, const int64_t* limit, const scalar_t* k, const scalar_t* v,
                  int64_t hkv_stride, const int64_t* pages, int64_t page_size, int64_t t0, int n,
                  const Partial& out) {
  // the block's K (then V) rows as floats (in place for a float cache), and the Q x block scores
  alignas(64) float buf[kBlock][D];
  const float* rows[kBlock];
  alignas(64) float s[kMaxQueries][kBlock];
  int live[kMaxQueries];  // tokens of the block query q sees
  for (int j = 0; j < n; ++j) rows[j] = load_row<scalar_t, D>(k, pages, page_size, hkv_stride, t0 + j, buf[j]);
  for (int q = 0; q < Q; ++q) {
    live[q] = static_cast<int>(std::clamp<int64_t>(limit[q] - t0, 0, n));
    if (live[q]) block_scores<D>(qf + q * D, rows, live[q], s[q]);
  }
  for (int q = 0; q < Q; ++q) {
    const int nq = live[q];
    if (!nq) continue;
    const float bm = block_max(s[q], nq, *out.m[q]);
    const float scale = std::exp(*out.m[q] - bm);  // 0 on the query's first block (m = -inf)
    *out.m[q] = bm;
    *out.l[q] = *out.l[q] * scale + block_exp(s[q], nq, bm);
    float* acc = out.acc[q];
#pragma omp simd
    for (int d = 0; d < D; ++d) acc[d] *= scale;
  }
  for (int j = 0; j < n; ++j) rows[j] = load_row<scalar_t, D>(v, pages, page_size, hkv_stride, t0 + j, buf[j]);
  int q = 0;
#if KVSTRATA_AVX512
  constexpr int NQ = D <= 64 ? 4 : D == 128 ? 2 : 1;  // queries a pass: NQ x D / 16 <= 16 accumulators
  if constexpr (NQ > 1) {
    for (; q + NQ <= Q; q += NQ) {  // runs of NQ queries that see the same tokens (all but a group's tail)
      if (!std::all_of(live + q, live + q + NQ, [&](int l) { return l == n; })) break;
      weighted_rows<D, NQ>(s[q], rows, n, &out.acc[q]);
    }
  }
#endif
  for (; q < Q; ++q) {
    if (live[q]) block_accumulate<D>(s[q], rows, live[q], out.acc[q]);
  }
}
