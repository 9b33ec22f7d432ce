// RMSNorm, and the residual add before it, as one op each (transformers' LlamaRMSNorm numerics:
// the mean of squares and the scale in float32, the normalised row rounded to the input dtype, then
// multiplied by the weight and rounded again). torch spends ~8 ops on a norm and 1 on the add, each a
// dispatch and a pass over the rows; a decode step has 61 norms, so the dispatches alone are
// milliseconds. The sum of squares is accumulated in another order than torch's, so results can
// differ from the torch path in the last bit: the model uses these ops only where it is not bound to
// match transformers token for token (kvstrata/model/llama.py). Registered as
// torch.ops.kvstrata.rms_norm and torch.ops.kvstrata.add_rms_norm.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <vector>

namespace {

template <typename scalar_t>
void norm_rows(scalar_t* x, const scalar_t* delta, const scalar_t* w, scalar_t* out, int64_t rows, int64_t n,
               float eps) {
  // ~32k elements a task: a decode step's few rows stay on one thread, a prefill's spread over all
  at::parallel_for(0, rows, std::max<int64_t>(1, 32768 / n), [&](int64_t first, int64_t last) {
    std::vector<float> xf(n);
    for (int64_t r = first; r < last; ++r) {
      scalar_t* xr = x + r * n;
      float ss = 0.f;
      if (delta != nullptr) {  // the residual add, rounded to the dtype as torch's add is
        const scalar_t* dr = delta + r * n;
        for (int64_t i = 0; i < n; ++i) {
          xr[i] = static_cast<scalar_t>(static_cast<float>(xr[i]) + static_cast<float>(dr[i]));
          xf[i] = static_cast<float>(xr[i]);
        }
      } else {
        for (int64_t i = 0; i < n; ++i) xf[i] = static_cast<float>(xr[i]);
      }
#pragma omp simd reduction(+ : ss)
      for (int64_t i = 0; i < n; ++i) ss += xf[i] * xf[i];
      const float scale = 1.f / std::sqrt(ss / static_cast<float>(n) + eps);
      scalar_t* o = out + r * n;
      for (int64_t i = 0; i < n; ++i) {
        const scalar_t h = static_cast<scalar_t>(xf[i] * scale);
        o[i] = static_cast<scalar_t>(static_cast<float>(w[i]) * static_cast<float>(h));
      }
    }
  });
}

void check(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "x: a contiguous [rows, hidden] tensor");
  TORCH_CHECK(w.dim() == 1 && w.is_contiguous() && w.size(0) == x.size(1), "weight: [hidden]");
  TORCH_CHECK(w.scalar_type() == x.scalar_type(), "x and weight in one dtype");
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  check(x, w);
  auto out = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm", [&] {
    norm_rows<scalar_t>(const_cast<scalar_t*>(x.data_ptr<scalar_t>()), nullptr, w.data_ptr<scalar_t>(),
                        out.data_ptr<scalar_t>(), x.size(0), x.size(1), static_cast<float>(eps));
  });
  return out;
}

// x += delta (in place), then rms_norm(x): the residual stream and the next sublayer's input
at::Tensor add_rms_norm(at::Tensor& x, const at::Tensor& delta, const at::Tensor& w, double eps) {
  check(x, w);
  TORCH_CHECK(delta.sizes() == x.sizes() && delta.is_contiguous() && delta.scalar_type() == x.scalar_type(),
              "delta: contiguous, x's shape and dtype");
  auto out = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "add_rms_norm", [&] {
    norm_rows<scalar_t>(x.data_ptr<scalar_t>(), delta.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(),
                        out.data_ptr<scalar_t>(), x.size(0), x.size(1), static_cast<float>(eps));
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kvstrata, m) {
  m.def("rms_norm(Tensor x, Tensor w, float eps) -> Tensor");
  m.def("add_rms_norm(Tensor(a!) x, Tensor delta, Tensor w, float eps) -> Tensor");
}

TORCH_LIBRARY_IMPL(kvstrata, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("add_rms_norm", &add_rms_norm);
}
