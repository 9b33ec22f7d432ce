// What the AVX2 tile loops of int_dot_avx2.h share (x86-64-v3: AVX2, FMA, F16C): KVSTRATA_AVX2 where the
// compiler targets them, unaligned loads of 32 bytes (LOADU) and of 8 float16 values as floats (HALVES), the
// prefetch of the tiles ahead, and a tile's biases. Used by the q4 family (int_dot_avx2_q4.h), the q5/q6/q8
// family (int_dot_avx2_hb.h) and the q8 signed-byte passes (int_dot_q8_bytes.h).
#pragma once

#include "int_dot_common.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define KVSTRATA_AVX2 1
#include <immintrin.h>

namespace kvstrata_int_dot {

constexpr int kPrefetch = 8;  // tiles ahead (prefetch_ahead)

#define LOADU(p) _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
#define HALVES(p) _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))

// The tile kPrefetch tiles on, into L1, while this one is computed (by passes that start at the first
// half; where each half has its own pass, the second finds the column in L1 or L2). A tile column is
// contiguous and the next one follows it, so the hardware prefetchers would find the stream too, but
// late: at one row a step the kernel waited on memory (docs/benchmarks.md: a 1B Q4_K_M decode step,
// bench/step_profile.py --ab-act-bits).
inline void prefetch_ahead(const uint8_t* wb, int64_t tile_bytes) {
  const uint8_t* p = wb + kPrefetch * tile_bytes;
  for (int64_t l = 0; l < tile_bytes; l += 64) _mm_prefetch(reinterpret_cast<const char*>(p + l), _MM_HINT_T0);
}

// A tile's 8 biases from `bias` (float16), or for a symmetric format (S) its scales `sc` times -zero
template <bool S>
inline __m256 biases(const uint8_t* bias, __m256 sc, Format f) {
  if constexpr (S) return _mm256_mul_ps(sc, _mm256_set1_ps(-f.zero()));
  else return HALVES(bias);
}

}  // namespace kvstrata_int_dot
#endif
