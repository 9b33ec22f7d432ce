// Every layer of a pure decode step (one new token per row, every linear on our integer-dot kernel) in one
// op call: the ~11 ops a layer that LlamaModel.forward would launch from Python, run from here in
// the same order on the same kernels, so the same bits. Each op launched from Python costs microseconds
// of dispatch and interpreter around a kernel that may take a tenth of that, and a step of SmolLM2's
// 30 layers launched ~330 of them (docs/cpu-kernels.md, "Decode layers in one op"). Here the ops are reached through the dispatcher's typed handles
// (found once), which skip Python altogether.
//
// Per layer, with h the normed input and x the residual stream (updated in place):
//   qkv = int_dot_linear(h, Wqkv) (+ bias); q = rope_store(qkv -> K/V cache rows `slots`)
//   o = paged_decode(q, caches, pages, lens); h = add_rms_norm(x += int_dot_linear(o, Wo), post_norm)
//   act = silu(gate) * up of int_dot_linear(h, Wgate_up); mlp = int_dot_linear(act, Wdown)
//   h = add_rms_norm(x += mlp, next layer's input norm), or x += mlp after the last layer
// `weights` holds 10 tensors a layer: the packed parts (csrc/int_dot_common.h) of qkv (3 slots), o (1),
// gate_up (2), down (1), a slot empty where a linear has fewer parts (one part where q, k and v share
// a block type); the qkv bias (empty: none), post_norm, the next layer's input norm (empty after the
// last). act_bits: the linears' activation integers (int_dot_linear.cpp). Registered as
// torch.ops.kvstrata.decode_layers; model/llama.py calls it where every piece of it applies.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <optional>

#include <vector>

namespace {

constexpr int64_t kPerLayer = 10;
constexpr int64_t kBias = 7, kPostNorm = 8, kNextNorm = 9;

using LinearFn = at::Tensor(const at::Tensor&, at::TensorList, int64_t);
using AddNormFn = at::Tensor(at::Tensor&, const at::Tensor&, const at::Tensor&, double);
using RopeFn = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, at::Tensor&, at::Tensor&,
                          const at::Tensor&, int64_t, int64_t, const std::optional<at::Tensor>&,
                          const std::optional<at::Tensor>&, double);
using DecodeFn = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                            const at::Tensor&, int64_t);
using SiluFn = at::Tensor(const at::Tensor&);

template <typename Fn>
c10::TypedOperatorHandle<Fn> op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Fn>();
}

struct Ops {  // the kernels' ops, found once (they are registered by the other sources of this library)
  c10::TypedOperatorHandle<LinearFn> linear = op<LinearFn>("kvstrata::int_dot_linear");
  c10::TypedOperatorHandle<AddNormFn> add_norm = op<AddNormFn>("kvstrata::add_rms_norm");
  c10::TypedOperatorHandle<RopeFn> rope = op<RopeFn>("kvstrata::rope_store");
  c10::TypedOperatorHandle<DecodeFn> attend = op<DecodeFn>("kvstrata::paged_decode");
  c10::TypedOperatorHandle<SiluFn> silu_mul = op<SiluFn>("kvstrata::silu_mul");
};

const Ops& ops() {
  static const Ops found;
  return found;
}

// the non-empty slots [first, first + count) of a layer's weights: one linear's packed parts
std::vector<at::Tensor> parts(const at::Tensor* w, int64_t first, int64_t count) {
  std::vector<at::Tensor> out;
  for (int64_t i = first; i < first + count; ++i)
    if (w[i].numel()) out.push_back(w[i]);
  TORCH_CHECK(!out.empty(), "every linear needs a packed part");
  return out;
}

at::Tensor decode_layers(at::Tensor& x, const at::Tensor& h0, at::TensorList weights, at::TensorList k_cache,
                         at::TensorList v_cache, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& slots,
                         const at::Tensor& pages, const at::Tensor& lens, int64_t page_size, int64_t H, int64_t Hkv,
                         double eps, bool fused_silu, int64_t act_bits) {
  const int64_t layers = static_cast<int64_t>(k_cache.size());
  TORCH_CHECK(layers >= 1 && static_cast<int64_t>(v_cache.size()) == layers, "one K and one V cache a layer");
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == kPerLayer * layers, "weights: ", kPerLayer, " tensors a layer");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && h0.sizes() == x.sizes(), "x, h: contiguous [rows, hidden]");
  TORCH_CHECK(!weights[kPerLayer * layers - 1].numel(), "the last layer has no next input norm");
  const Ops& k = ops();
  const int64_t T = x.size(0);
  at::Tensor h = h0;
  for (int64_t li = 0; li < layers; ++li) {
    const at::Tensor* w = weights.data() + kPerLayer * li;
    at::Tensor qkv = k.linear.call(h, parts(w, 0, 3), act_bits);
    if (w[kBias].numel()) qkv = qkv + w[kBias];
    at::Tensor kc = k_cache[li], vc = v_cache[li];
    const at::Tensor q = k.rope.call(qkv, cos, sin, kc, vc, slots, H, Hkv, std::nullopt, std::nullopt, 0.0);  // no q/k norms here
    const at::Tensor o = k.attend.call(q, kc, vc, pages, lens, page_size);
    h = k.add_norm.call(x, k.linear.call(o.reshape({T, -1}), parts(w, 3, 1), act_bits), w[kPostNorm], eps);
    const at::Tensor gate_up = k.linear.call(h, parts(w, 4, 2), act_bits);
    at::Tensor act;
    if (fused_silu) {
      act = k.silu_mul.call(gate_up);
    } else {
      const auto parts = gate_up.chunk(2, -1);
      act = at::silu(parts[0]) * parts[1];
    }
    const at::Tensor mlp = k.linear.call(act, parts(w, 6, 1), act_bits);
    if (w[kNextNorm].numel()) {
      h = k.add_norm.call(x, mlp, w[kNextNorm], eps);
    } else {
      x.add_(mlp);
    }
  }
  return h;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kvstrata, m) {
  m.def("decode_layers(Tensor(a!) x, Tensor h, Tensor[] weights, Tensor(b!)[] k_cache, Tensor(c!)[] v_cache, "
        "Tensor cos, Tensor sin, Tensor slots, Tensor pages, Tensor lens, int page_size, int H, int Hkv, float eps, "
        "bool fused_silu, int act_bits=16) -> Tensor");
}

TORCH_LIBRARY_IMPL(kvstrata, CPU, m) {
  m.impl("decode_layers", &decode_layers);
}
