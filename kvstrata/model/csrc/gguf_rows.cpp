// Rows of a GGUF matrix read from the file and dequantized to float32 in one op (model/quant/gguf_rows.py):
// a decode step's embedding row and its LM head candidates' rows (int8_head.py rescores them). The
// `gguf` package's numpy dequantize of those rows was a visible share of a batch-1 decode step
// (docs/cpu-kernels.md).
// Each row is read with pread (never through a map: gguf_rows.py says why) and decoded
// block by block with the layouts of llama.cpp's ggml-quants, as the package reads them. Every value is an
// exact product of a float16 and small integers (at most 24 significant bits), plus at most one
// rounded addition (the Q4_1/Q5_1 min, the K-quants' -dmin * m): the same bits as the package gives.
// Types: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K (GGML type ids); others stay on
// the package's path. Registered as torch.ops.kvstrata.gguf_rows(fd, offset, row_bytes, ids, type, cols, num_rows).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace {

enum GgmlType : int64_t { kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8,
                          kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kBF16 = 30 };

struct Layout { int64_t values, bytes; };  // values and bytes a block

Layout layout_of(int64_t type) {
  switch (type) {
    case kF32: return {1, 4};
    case kF16: case kBF16: return {1, 2};
    case kQ4_0: return {32, 18};
    case kQ4_1: return {32, 20};
    case kQ5_0: return {32, 22};
    case kQ5_1: return {32, 24};
    case kQ8_0: return {32, 34};
    case kQ4_K: return {256, 144};
    case kQ5_K: return {256, 176};
    case kQ6_K: return {256, 210};
    default: return {0, 0};
  }
}

inline float f16(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

// Q4_K / Q5_K: group g's 6-bit scale and min from the 12 scale bytes
inline void k_scale_min(const uint8_t* s, int g, float& sc, float& m) {
  if (g < 4) {
    sc = static_cast<float>(s[g] & 63);
    m = static_cast<float>(s[g + 4] & 63);
  } else {
    sc = static_cast<float>((s[g + 4] & 0x0F) | ((s[g - 4] >> 2) & 0x30));
    m = static_cast<float>((s[g + 4] >> 4) | ((s[g] >> 2) & 0x30));
  }
}

// One block of `type` at b -> out[0 .. values)
void decode_block(int64_t type, const uint8_t* b, float* out) {
  switch (type) {
    case kF32: std::memcpy(out, b, 4); return;
    case kF16: out[0] = f16(b); return;
    case kBF16: {
      uint16_t bits;
      std::memcpy(&bits, b, 2);
      out[0] = static_cast<float>(c10::BFloat16(bits, c10::BFloat16::from_bits()));
      return;
    }
    case kQ4_0: case kQ4_1: {  // d (, m), 16 bytes: value t the low nibble of byte t, value 16 + t its high one
      const bool min = type == kQ4_1;
      const float d = f16(b), m = min ? f16(b + 2) : 0.0f;
      const uint8_t* qs = b + (min ? 4 : 2);
      for (int t = 0; t < 16; ++t) {
        const int lo = qs[t] & 0x0F, hi = qs[t] >> 4;
        out[t] = min ? d * static_cast<float>(lo) + m : d * static_cast<float>(lo - 8);
        out[t + 16] = min ? d * static_cast<float>(hi) + m : d * static_cast<float>(hi - 8);
      }
      return;
    }
    case kQ5_0: case kQ5_1: {  // d (, m), 4 bytes of fifth bits (value t: bit t), 16 bytes of nibbles
      const bool min = type == kQ5_1;
      const float d = f16(b), m = min ? f16(b + 2) : 0.0f;
      const uint8_t* qh = b + (min ? 4 : 2);
      const uint32_t high = qh[0] | (qh[1] << 8) | (qh[2] << 16) | (static_cast<uint32_t>(qh[3]) << 24);
      const uint8_t* qs = qh + 4;
      for (int t = 0; t < 32; ++t) {
        const int q = (t < 16 ? qs[t] & 0x0F : qs[t - 16] >> 4) | (((high >> t) & 1) << 4);
        out[t] = min ? d * static_cast<float>(q) + m : d * static_cast<float>(q - 16);
      }
      return;
    }
    case kQ8_0: {
      const float d = f16(b);
      for (int t = 0; t < 32; ++t) out[t] = d * static_cast<float>(static_cast<int8_t>(b[2 + t]));
      return;
    }
    case kQ4_K: case kQ5_K: {  // d, dmin, 12 scale bytes, (Q5_K: 32 bytes of fifth bits,) 128 bytes of nibbles
      const float d = f16(b), dmin = f16(b + 2);
      const uint8_t* s = b + 4;
      const bool five = type == kQ5_K;
      const uint8_t* qh = b + 16;
      const uint8_t* qs = b + (five ? 48 : 16);
      for (int g = 0; g < 8; ++g) {  // group g: the low (even g) or high nibbles of bytes 32 (g / 2) ..
        float sc, mn;
        k_scale_min(s, g, sc, mn);
        const float scale = d * sc, bias = dmin * mn;
        const uint8_t* q = qs + 32 * (g / 2);
        for (int t = 0; t < 32; ++t) {
          int v = (g % 2 ? q[t] >> 4 : q[t] & 0x0F);
          if (five) v |= ((qh[t] >> g) & 1) << 4;
          out[32 * g + t] = scale * static_cast<float>(v) - bias;
        }
      }
      return;
    }
    case kQ6_K: {  // 128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales, d
      const uint8_t* ql = b;
      const uint8_t* qh = b + 128;
      const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
      const float d = f16(b + 208);
      for (int h = 0; h < 2; ++h)  // value 128 h + 32 k + t: nibble k / 2 of low byte 64 h + 32 (k % 2) + t,
        for (int k = 0; k < 4; ++k) {  // bit pair k of high byte 32 h + t
          const uint8_t* lo = ql + 64 * h + 32 * (k % 2);
          const uint8_t* hi = qh + 32 * h;
          float* o = out + 128 * h + 32 * k;
          const float s0 = d * static_cast<float>(sc[8 * h + 2 * k]), s1 = d * static_cast<float>(sc[8 * h + 2 * k + 1]);
          for (int t = 0; t < 32; ++t) {
            const int q = ((lo[t] >> (4 * (k / 2))) & 0x0F) | (((hi[t] >> (2 * k)) & 3) << 4);
            o[t] = (t < 16 ? s0 : s1) * static_cast<float>(q - 32);
          }
        }
      return;
    }
    default: TORCH_CHECK(false, "gguf_rows: GGML type ", type, " is not decoded here");
  }
}

at::Tensor gguf_rows(int64_t fd, int64_t offset, int64_t row_bytes, const at::Tensor& ids, int64_t type,
                     int64_t cols, int64_t num_rows) {
  const Layout l = layout_of(type);
  TORCH_CHECK(l.values > 0, "gguf_rows: GGML type ", type, " is not decoded here");
  TORCH_CHECK(cols > 0 && cols % l.values == 0 && row_bytes == cols / l.values * l.bytes,
              "gguf_rows: ", cols, " columns of type ", type, " are not ", row_bytes, " bytes a row");
  TORCH_CHECK(ids.dim() == 1 && ids.scalar_type() == at::kLong, "gguf_rows: ids, a 1-D int64 tensor");
  const at::Tensor idc = ids.contiguous();
  const int64_t* id = idc.data_ptr<int64_t>();
  const int64_t n = idc.numel();
  for (int64_t i = 0; i < n; ++i)
    TORCH_CHECK_INDEX(id[i] >= 0 && id[i] < num_rows, "row ids outside [0, ", num_rows, "): ", id[i]);
  auto out = at::empty({n, cols}, at::kFloat);
  float* o = out.data_ptr<float>();
  at::parallel_for(0, n, 16, [&](int64_t first, int64_t last) {
    std::vector<uint8_t> raw(row_bytes);
    for (int64_t i = first; i < last; ++i) {
      int64_t got = 0;
      while (got < row_bytes) {
        const ssize_t r = pread(static_cast<int>(fd), raw.data() + got, row_bytes - got, offset + id[i] * row_bytes + got);
        if (r < 0 && errno == EINTR) continue;
        TORCH_CHECK(r > 0, "gguf_rows: short read of row ", id[i]);
        got += r;
      }
      for (int64_t blk = 0; blk < cols / l.values; ++blk) decode_block(type, raw.data() + blk * l.bytes, o + i * cols + blk * l.values);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kvstrata, m) {
  m.def("gguf_rows(int fd, int offset, int row_bytes, Tensor ids, int type, int cols, int num_rows) -> Tensor", &gguf_rows);
}
