// RoPE on the fused q/k/v projection and the K/V write into the page pool, as one op, with Qwen3's
// per-head RMSNorms of q and k before it where the model has them.
// torch spends ~10 ops a layer on it (views, rotate_half's slices/neg/cat, two muls and an add, two
// index_copy_ calls), ~20 more with the two norms; here each token's heads are (normed as rms_norm.cpp
// norms a row, then) rotated in float32 and rounded once, q into a new [T, H, D] tensor, k and v straight
// into their pool slots. (torch rounds after each mul and the add, so bf16 results can differ in the last
// bit: the model uses this op under the same rule as the fused norms, kvstrata/model/llama.py.)
// Registered as torch.ops.kvstrata.rope_store.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

namespace {

// x's D values RMS-normed by w into y (rms_norm.cpp's numerics: float32 sums, the normed value rounded to
// the dtype, then times the weight and rounded again)
template <typename scalar_t>
void norm_head(const scalar_t* x, const scalar_t* w, int64_t D, float eps, scalar_t* y) {
  float ss = 0.f;
#pragma omp simd reduction(+ : ss)
  for (int64_t i = 0; i < D; ++i) ss += static_cast<float>(x[i]) * static_cast<float>(x[i]);
  const float scale = 1.f / std::sqrt(ss / static_cast<float>(D) + eps);
  for (int64_t i = 0; i < D; ++i) {
    const scalar_t h = static_cast<scalar_t>(static_cast<float>(x[i]) * scale);
    y[i] = static_cast<scalar_t>(static_cast<float>(w[i]) * static_cast<float>(h));
  }
}

template <typename scalar_t>
void rope_store_impl(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& k_cache,
                     at::Tensor& v_cache, const at::Tensor& slots, int64_t H, int64_t Hkv, const scalar_t* q_norm,
                     const scalar_t* k_norm, float eps, at::Tensor& q) {
  const int64_t T = qkv.size(0), D = cos.size(1), half = D / 2, width = (H + 2 * Hkv) * D;
  const scalar_t* src = qkv.data_ptr<scalar_t>();
  const scalar_t* c = cos.data_ptr<scalar_t>();
  const scalar_t* s = sin.data_ptr<scalar_t>();
  const int64_t* slot = slots.data_ptr<int64_t>();
  scalar_t* qo = q.data_ptr<scalar_t>();
  scalar_t* ko = k_cache.data_ptr<scalar_t>();
  scalar_t* vo = v_cache.data_ptr<scalar_t>();
  at::parallel_for(0, T, std::max<int64_t>(1, 16384 / width), [&](int64_t first, int64_t last) {
    std::vector<scalar_t> normed(q_norm ? D : 0);
    for (int64_t t = first; t < last; ++t) {
      const scalar_t* row = src + t * width;
      const scalar_t* ct = c + t * D;
      const scalar_t* st = s + t * D;
      for (int64_t h = 0; h < H + Hkv; ++h) {  // q heads, then k heads: rotated
        const scalar_t* x = row + h * D;
        if (q_norm) {  // Qwen3: q heads by q_norm, k heads by k_norm
          norm_head(x, h < H ? q_norm : k_norm, D, eps, normed.data());
          x = normed.data();
        }
        scalar_t* o = h < H ? qo + (t * H + h) * D : ko + (slot[t] * Hkv + (h - H)) * D;
        for (int64_t i = 0; i < half; ++i) {  // rotate_half(x) = [-x2, x1]
          const float x1 = static_cast<float>(x[i]), x2 = static_cast<float>(x[i + half]);
          o[i] = static_cast<scalar_t>(x1 * static_cast<float>(ct[i]) - x2 * static_cast<float>(st[i]));
          o[i + half] = static_cast<scalar_t>(x2 * static_cast<float>(ct[i + half]) + x1 * static_cast<float>(st[i + half]));
        }
      }
      const scalar_t* v = row + (H + Hkv) * D;
      scalar_t* vdst = vo + slot[t] * Hkv * D;
      for (int64_t i = 0; i < Hkv * D; ++i) vdst[i] = v[i];
    }
  });
}

at::Tensor rope_store(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& k_cache,
                      at::Tensor& v_cache, const at::Tensor& slots, int64_t H, int64_t Hkv,
                      const std::optional<at::Tensor>& q_norm, const std::optional<at::Tensor>& k_norm, double eps) {
  TORCH_CHECK(qkv.dim() == 2 && qkv.is_contiguous(), "qkv: contiguous [T, (H + 2 Hkv) * D]");
  TORCH_CHECK(cos.dim() == 2 && cos.is_contiguous() && sin.sizes() == cos.sizes() && sin.is_contiguous(),
              "cos, sin: contiguous [T, D]");
  const int64_t T = qkv.size(0), D = cos.size(1);
  TORCH_CHECK(cos.size(0) == T && D % 2 == 0 && qkv.size(1) == (H + 2 * Hkv) * D, "qkv, cos: T rows of (H + 2 Hkv) heads of D");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.dim() == 3 && k_cache.sizes() == v_cache.sizes() &&
              k_cache.size(1) == Hkv && k_cache.size(2) == D, "caches: contiguous [slots, Hkv, D]");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.is_contiguous() && slots.numel() == T, "slots: int64 [T]");
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&cos, &sin, &k_cache, &v_cache}) TORCH_CHECK(t->scalar_type() == qkv.scalar_type(), "one dtype");
  const int64_t* sl = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t) TORCH_CHECK(sl[t] >= 0 && sl[t] < k_cache.size(0), "slot ", sl[t], " outside the pool");
  TORCH_CHECK(q_norm.has_value() == k_norm.has_value(), "q_norm and k_norm: both or neither");
  if (q_norm) {
    for (const at::Tensor* w : {&*q_norm, &*k_norm})
      TORCH_CHECK(w->dim() == 1 && w->size(0) == D && w->is_contiguous() && w->scalar_type() == qkv.scalar_type(),
                  "q_norm, k_norm: contiguous [D] in qkv's dtype");
  }
  auto q = at::empty({T, H, D}, qkv.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, qkv.scalar_type(), "rope_store", [&] {
    rope_store_impl<scalar_t>(qkv, cos, sin, k_cache, v_cache, slots, H, Hkv,
                              q_norm ? q_norm->data_ptr<scalar_t>() : nullptr,
                              k_norm ? k_norm->data_ptr<scalar_t>() : nullptr, static_cast<float>(eps), q);
  });
  return q;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kvstrata, m) {
  m.def("rope_store(Tensor qkv, Tensor cos, Tensor sin, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slots, int H, int Hkv, "
        "Tensor? q_norm=None, Tensor? k_norm=None, float eps=1e-6) -> Tensor");
}

TORCH_LIBRARY_IMPL(kvstrata, CPU, m) {
  m.impl("rope_store", &rope_store);
}
