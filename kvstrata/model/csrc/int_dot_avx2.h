// The AVX2 forms of csrc/int_dot_linear.cpp's tile loops (x86-64-v3: AVX2, FMA, F16C; also run on
// AVX-512 CPUs for q5/q6/q8): one tile column's output rows for a few activation rows at a time, in
// halves of 8 output rows a ymm. Templated on W: 16-bit activations (hi and lo bytes), or 8-bit ones
// (lo only: half the products). The same integers and float operations as the portable loops.
// The loops themselves are in two families, on the helpers of int_dot_avx2_common.h: q4 on nibble planes
// (int_dot_avx2_q4.h) and q5/q6/q8 with high bits (int_dot_avx2_hb.h). Here, which family and which
// shape of passes a call takes (avx2_tiles).
#pragma once

#include "int_dot_avx2_common.h"  // defines KVSTRATA_AVX2 where it builds the forms
#include "int_dot_avx2_hb.h"
#include "int_dot_avx2_q4.h"

#if KVSTRATA_AVX2
namespace kvstrata_int_dot {

// Passes of at most 4 rows (q4) or 2 (the others: 16 ymm registers), each over both halves of every tile: the
// column streams from memory once and the activations are broadcast once a pass (rows 1-4 gain, rows 8 the
// same: docs/cpu-kernels.md); a tile column's weights (K/32 tiles of 288-576 bytes) stay in L1/L2 between
// the passes. With 16-bit activations the q5/q6/q8 passes of 2 rows would spill their 16
// accumulators, so a batch of more than 2 rows takes each half in its own pass there (slower by 5-15%
// with both).
template <bool W>
void avx2_tiles(const Activations& a, int64_t r0, int R, int64_t K, const uint8_t* w, Format f, float* out) {
  if (f.high_bits == 0) {
    if (f.kblocks) q4_passes<W, Q4::kBlocks>(a, r0, R, K, w, out);
    else if (f.symmetric) q4_passes<W, Q4::kSymmetric>(a, r0, R, K, w, out);
    else q4_passes<W, Q4::kStored>(a, r0, R, K, w, out);
    return;
  }
  if (!W && R >= kRowsHalfMin && f.high_bits != 4) {  // q5/q6, 8-bit rows: a half a pass (hb_rows_half)
    const auto half = f.high_bits == 1 ? (f.symmetric ? hb_rows_half<1, 1, true> : hb_rows_half<1, 1, false>)
                                       : (f.symmetric ? hb_rows_half<2, 2, true> : hb_rows_half<2, 2, false>);
    for (int h = 0; h < 2; ++h) half(a, r0, R, K, w, out, h);
    return;
  }
  if (!W || R <= 2) {
    for (int r = 0; r < R; r += 2) hb_pass<W, 2, 0>(a, r0 + r, std::min(R - r, 2), K, w, f, out + r * kLanes);
    return;
  }
  for (int h = 0; h < 2; ++h) {
    for (int r = 0; r < R; r += 2) {
      float* o = out + r * kLanes;
      h == 0 ? hb_pass<W, 1, 0>(a, r0 + r, std::min(R - r, 2), K, w, f, o)
             : hb_pass<W, 1, 1>(a, r0 + r, std::min(R - r, 2), K, w, f, o);
    }
  }
}

}  // namespace kvstrata_int_dot
#endif
