// RoPE on the fused q/k/v projection and the K/V write into the page pool, as one op.
// torch spends ~10 ops a layer on it (views, rotate_half's slices/neg/cat, two muls and an add, two
// index_copy_ calls); here each token's heads are rotated in float32 and rounded once, q into a new
// [T, H, D] tensor, k and v straight into their pool slots. (torch rounds after each mul and the add,
// so bf16 results can differ in the last bit: the model uses this op under the same rule as the fused
// norms, kvstrata/model/llama.py.) Registered as torch.ops.kvstrata.rope_store.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>

namespace {

template <typename scalar_t>
void rope_store_impl(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& k_cache,
                     at::Tensor& v_cache, const at::Tensor& slots, int64_t H, int64_t Hkv, at::Tensor& q) {
  const int64_t T = qkv.size(0), D = cos.size(1), half = D / 2, width = (H + 2 * Hkv) * D;
  const scalar_t* src = qkv.data_ptr<scalar_t>();
  const scalar_t* c = cos.data_ptr<scalar_t>();
  const scalar_t* s = sin.data_ptr<scalar_t>();
  const int64_t* slot = slots.data_ptr<int64_t>();
  scalar_t* qo = q.data_ptr<scalar_t>();
  scalar_t* ko = k_cache.data_ptr<scalar_t>();
  scalar_t* vo = v_cache.data_ptr<scalar_t>();
  at::parallel_for(0, T, std::max<int64_t>(1, 16384 / width), [&](int64_t first, int64_t last) {
    for (int64_t t = first; t < last; ++t) {
      const scalar_t* row = src + t * width;
      const scalar_t* ct = c + t * D;
      const scalar_t* st = s + t * D;
      for (int64_t h = 0; h < H + Hkv; ++h) {  // q heads, then k heads: rotated
        const scalar_t* x = row + h * D;
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
                      at::Tensor& v_cache, const at::Tensor& slots, int64_t H, int64_t Hkv) {
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
  auto q = at::empty({T, H, D}, qkv.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, qkv.scalar_type(), "rope_store", [&] {
    rope_store_impl<scalar_t>(qkv, cos, sin, k_cache, v_cache, slots, H, Hkv, q);
  });
  return q;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kvstrata, m) {
  m.def("rope_store(Tensor qkv, Tensor cos, Tensor sin, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slots, int H, int Hkv) -> Tensor");
}

TORCH_LIBRARY_IMPL(kvstrata, CPU, m) {
  m.impl("rope_store", &rope_store);
}
