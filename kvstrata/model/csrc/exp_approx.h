// Shared by the CPU kernels in this folder: a vectorizable exp for softmax weights.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace kvstrata {

// exp(x) for x <= 0 in arithmetic and bit operations only, so `omp simd` vectorizes it (std::exp stays a
// scalar call): x = n ln2 + r with |r| <= ln2 / 2, exp(r) by Cephes' degree-5 polynomial (~1 ulp), 2^n
// written into the exponent bits. Below -87 the result is 0's neighbour (2^-126), weight ~0 either way.
inline float exp_nonpositive(float x) {
  x = std::max(x, -87.f);
  const float n = std::nearbyint(x * 1.44269504088896341f);
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

}  // namespace kvstrata
