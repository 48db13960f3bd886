// The op table's fp32 families on the CUDA backend (op_table_runners.h): the encoder, the norms,
// the Linear layer and the raw GEMM, column sums, GELU, cross-entropy, AdamW (whole buffers and
// owned ranges), RoPE and SwiGLU, each against its CPU twin. Backward kernels that accumulate are
// run onto random gradients, so that an overwrite is caught.
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "lib/model/crossentropy.h"
#include "lib/model/encoder.h"
#include "lib/model/gelu.h"
#include "lib/model/layernorm.h"
#include "lib/model/layout.h"
#include "lib/model/matmul.h"
#include "lib/model/rmsnorm.h"
#include "lib/model/rope.h"
#include "lib/model/spec.h"
#include "lib/model/swiglu.h"
#include "lib/optim/adamw.h"
#include "tests/gpu/op_table_runners.h"

namespace kilter::optable {

namespace km = kilter::model;
using gputest::DeviceBuffer;
using gputest::offsets_of;
using gputest::random_floats;
using gputest::random_int;

namespace {

// Packed pieces (shape.lengths), positions from shape.offsets (later parts of cut pieces) or 0;
// wpe (context rows) unless shape.position_table is false (the Llama family).
void run_encoder(CaseContext& x) {
  const Shape& s = x.c.shape;
  const int C = s.C, V = s.V;
  const std::vector<int32_t> cu = offsets_of(s.lengths);
  const int N = cu.back(), pieces = static_cast<int>(s.lengths.size());
  std::vector<int32_t> inp(N);
  for (int32_t& id : inp) id = random_int(0, V - 1);
  const auto wte = random_floats(size_t(V) * C);
  const auto wpe = s.position_table ? random_floats(size_t(s.context) * C) : std::vector<float>();
  const int32_t* host_offset = s.offsets.empty() ? nullptr : s.offsets.data();
  std::vector<float> out(size_t(N) * C);
  km::encoder_forward(out.data(), inp.data(), wte.data(), s.position_table ? wpe.data() : nullptr, cu.data(), pieces,
                      C, host_offset);
  DeviceBuffer<int32_t> d_inp(inp), d_cu(cu), d_offset(s.offsets);
  const int32_t* device_offset = s.offsets.empty() ? nullptr : d_offset.get();
  DeviceBuffer<float> d_wte(wte), d_wpe(wpe), d_out(out.size());
  float* d_wpe_or_null = s.position_table ? d_wpe.get() : nullptr;
  kc::encoder_forward(d_out.get(), d_inp.get(), d_wte.get(), d_wpe_or_null, d_cu.get(), pieces, N, C, x.stream(),
                      device_offset);
  x.check.near(x.tag("encoder_forward out"), d_out.download(), out, x.c.tol.fwd);

  const auto dout = random_floats(out.size());
  auto dwte = random_floats(wte.size()), dwpe = random_floats(wpe.size());  // accumulated onto
  DeviceBuffer<float> d_dout(dout), d_dwte(dwte), d_dwpe(dwpe);
  km::encoder_backward(dwte.data(), s.position_table ? dwpe.data() : nullptr, dout.data(), inp.data(), cu.data(),
                       pieces, C, host_offset);
  kc::encoder_backward(d_dwte.get(), s.position_table ? d_dwpe.get() : nullptr, d_dout.get(), d_inp.get(), d_cu.get(),
                       pieces, N, s.context, C, x.stream(), device_offset);
  x.check.near(x.tag("encoder_backward dwte (accumulated)"), d_dwte.download(), dwte, x.c.tol.bwd);
  if (s.position_table)
    x.check.near(x.tag("encoder_backward dwpe (accumulated)"), d_dwpe.download(), dwpe, x.c.tol.bwd);
}

void run_layernorm(CaseContext& x) {
  const int N = x.c.shape.N, C = x.c.shape.C;
  const auto inp = random_floats(size_t(N) * C, 2.0f), weight = random_floats(C), bias = random_floats(C);
  std::vector<float> out(size_t(N) * C), mean(N), rstd(N);
  km::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, C);
  DeviceBuffer<float> d_inp(inp), d_w(weight), d_b(bias), d_out(out.size()), d_mean(N), d_rstd(N);
  kc::layernorm_forward(d_out.get(), d_mean.get(), d_rstd.get(), d_inp.get(), d_w.get(), d_b.get(), N, C, x.stream());
  x.check.near(x.tag("layernorm_forward out"), d_out.download(), out, x.c.tol.fwd);
  x.check.near(x.tag("layernorm_forward mean"), d_mean.download(), mean, x.c.tol.fwd);
  x.check.near(x.tag("layernorm_forward rstd"), d_rstd.download(), rstd, x.c.tol.fwd);

  const auto dout = random_floats(out.size());
  auto dinp = random_floats(inp.size()), dw = random_floats(C), db = random_floats(C);  // accumulated onto
  DeviceBuffer<float> d_dout(dout), d_dinp(dinp), d_dw(dw), d_db(db);
  DeviceBuffer<float> scratch(2 * kc::column_sum_scratch_floats(C));
  km::layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), weight.data(), mean.data(),
                         rstd.data(), N, C);
  kc::layernorm_backward(d_dinp.get(), d_dw.get(), d_db.get(), d_dout.get(), d_inp.get(), d_w.get(), d_mean.get(),
                         d_rstd.get(), N, C, scratch.get(), x.stream());
  x.check.near(x.tag("layernorm_backward dinp"), d_dinp.download(), dinp, x.c.tol.bwd);
  x.check.near(x.tag("layernorm_backward dweight"), d_dw.download(), dw, x.c.tol.bwd);
  x.check.near(x.tag("layernorm_backward dbias"), d_db.download(), db, x.c.tol.bwd);
}

void run_rmsnorm(CaseContext& x) {
  const int N = x.c.shape.N, C = x.c.shape.C;
  const float eps = 1e-6f;
  const auto inp = random_floats(size_t(N) * C, 2.0f), weight = random_floats(C);
  std::vector<float> out(inp.size()), rstd(N);
  km::rmsnorm_forward(out.data(), rstd.data(), inp.data(), weight.data(), N, C, eps);
  DeviceBuffer<float> d_inp(inp), d_w(weight), d_out(out.size()), d_rstd(N);
  kc::rmsnorm_forward(d_out.get(), d_rstd.get(), d_inp.get(), d_w.get(), N, C, eps, x.stream());
  x.check.near(x.tag("rmsnorm_forward out"), d_out.download(), out, x.c.tol.fwd);
  x.check.near(x.tag("rmsnorm_forward rstd"), d_rstd.download(), rstd, x.c.tol.fwd);
  const auto dout = random_floats(out.size());
  auto dinp = random_floats(inp.size()), dw = random_floats(C);  // accumulated onto
  DeviceBuffer<float> d_dout(dout), d_dinp(dinp), d_dw(dw), scratch(2 * kc::column_sum_scratch_floats(C));
  km::rmsnorm_backward(dinp.data(), dw.data(), dout.data(), inp.data(), weight.data(), rstd.data(), N, C);
  kc::rmsnorm_backward(d_dinp.get(), d_dw.get(), d_dout.get(), d_inp.get(), d_w.get(), d_rstd.get(), N, C,
                       scratch.get(), x.stream());
  x.check.near(x.tag("rmsnorm_backward dinp"), d_dinp.download(), dinp, x.c.tol.bwd);
  x.check.near(x.tag("rmsnorm_backward dweight"), d_dw.download(), dw, x.c.tol.bwd);
}

// out (C) += the column sums of x (N,C), onto a random out.
void run_column_sums(CaseContext& x) {
  const int N = x.c.shape.N, C = x.c.shape.C;
  const auto rows = random_floats(size_t(N) * C);
  auto sums = random_floats(C);
  DeviceBuffer<float> d_rows(rows), d_sums(sums), scratch(kc::column_sum_scratch_floats(C));
  for (int c = 0; c < C; ++c) {
    double sum = sums[c];
    for (int r = 0; r < N; ++r) sum += rows[size_t(r) * C + c];
    sums[c] = static_cast<float>(sum);
  }
  kc::column_sums_accumulate(d_sums.get(), d_rows.get(), N, C, scratch.get(), x.stream());
  x.check.near(x.tag("column_sums_accumulate (fp32 rows)"), d_sums.download(), sums, x.c.tol.fwd);
}

// Forward, forward with the residual fused, backward accumulating onto random gradients, and
// backward with dinp overwritten (accumulate_dinp = false, the CPU's _overwrite_dinp form).
void run_matmul(CaseContext& x) {
  const int N = x.c.shape.N, C = x.c.shape.C, OC = x.c.shape.OC;
  const auto inp = random_floats(size_t(N) * C), weight = random_floats(size_t(OC) * C);
  const auto bias = random_floats(OC), residual = random_floats(size_t(N) * OC);
  std::vector<float> out(size_t(N) * OC), out_res(out.size());
  km::matmul_forward(out.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
  km::matmul_forward_residual(out_res.data(), residual.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
  DeviceBuffer<float> d_inp(inp), d_w(weight), d_b(bias), d_res(residual), d_out(out.size()), d_out_res(out.size());
  kc::matmul_forward(x.gemm, d_out.get(), d_inp.get(), d_w.get(), d_b.get(), N, C, OC);
  kc::matmul_forward_residual(x.gemm, d_out_res.get(), d_inp.get(), d_w.get(), d_b.get(), d_res.get(), N, C, OC);
  x.check.near(x.tag("matmul_forward"), d_out.download(), out, x.c.tol.fwd);
  x.check.near(x.tag("matmul_forward_residual"), d_out_res.download(), out_res, x.c.tol.fwd);

  const auto dout = random_floats(out.size());
  auto dinp = random_floats(inp.size()), dw = random_floats(weight.size()), db = random_floats(OC);
  DeviceBuffer<float> d_dout(dout), d_dinp(dinp), d_dw(dw), d_db(db), scratch(kc::column_sum_scratch_floats(OC));
  km::matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), weight.data(), N, C, OC);
  kc::matmul_backward(x.gemm, d_dinp.get(), d_dw.get(), d_db.get(), d_dout.get(), d_inp.get(), d_w.get(), N, C, OC,
                      scratch.get());
  x.check.near(x.tag("matmul_backward dinp (accumulated)"), d_dinp.download(), dinp, x.c.tol.bwd);
  x.check.near(x.tag("matmul_backward dweight (accumulated)"), d_dw.download(), dw, x.c.tol.bwd);
  x.check.near(x.tag("matmul_backward dbias (accumulated)"), d_db.download(), db, x.c.tol.fp32);
  std::vector<float> dinp_new(inp.size());
  km::matmul_backward_overwrite_dinp(dinp_new.data(), dw.data(), nullptr, dout.data(), inp.data(), weight.data(), N, C,
                                     OC);
  kc::matmul_backward(x.gemm, d_dinp.get(), d_dw.get(), nullptr, d_dout.get(), d_inp.get(), d_w.get(), N, C, OC,
                      scratch.get(), /*accumulate_dinp=*/false);
  x.check.near(x.tag("matmul_backward dinp (overwritten)"), d_dinp.download(), dinp_new, x.c.tol.bwd);
  x.check.near(x.tag("matmul_backward dweight, second accumulation"), d_dw.download(), dw, x.c.tol.bwd);
}

// Column-major D (m,n) = alpha op(A) op(B) + beta C + bias, batched: the reference in double on
// the operands the engine multiplies (rounded to bf16 first for Math::bf16_inputs).
std::vector<float> gemm_reference(const Shape& s, std::vector<float> A, std::vector<float> B,
                                  const std::vector<float>& C, const std::vector<float>& bias, float alpha,
                                  bool round_operands) {
  const int m = s.OC, n = s.N, k = s.C;
  if (round_operands) {
    km::round_bf16_inplace(A.data(), A.size());
    km::round_bf16_inplace(B.data(), B.size());
  }
  const size_t sa = size_t(m) * k, sb = size_t(k) * n, sd = size_t(m) * n;
  std::vector<float> D(sd * s.batch);
  for (int b = 0; b < s.batch; ++b)
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i) {
        double sum = 0.0;
        for (int l = 0; l < k; ++l) {
          const double a = s.trans_a ? A[b * sa + size_t(i) * k + l] : A[b * sa + size_t(l) * m + i];
          const double bv = s.trans_b ? B[b * sb + size_t(l) * n + j] : B[b * sb + size_t(j) * k + l];
          sum += a * bv;
        }
        double d = alpha * sum + double(s.beta) * C[b * sd + size_t(j) * m + i];
        if (s.bias) d += bias[i];
        D[b * sd + size_t(j) * m + i] = static_cast<float>(d);
      }
  return D;
}

// Gemm::run on its own: transposes, alpha/beta with C, the bias epilogue, strided batches; with
// bf16 inputs also the operand scratch (reserved, then shared with a second engine).
void run_gemm(CaseContext& x) {
  const Shape& s = x.c.shape;
  const int m = s.OC, n = s.N, k = s.C;
  const kc::GemmMath want = x.c.math == Math::fp32 ? kc::GemmMath::fp32 : kc::GemmMath::bf16;
  x.check.expect(x.tag("Gemm::math is the case's"), x.gemm.math() == want);
  const size_t sa = size_t(m) * k, sb = size_t(k) * n, sd = size_t(m) * n;
  const auto A = random_floats(sa * s.batch), B = random_floats(sb * s.batch), C = random_floats(sd * s.batch);
  const auto bias = random_floats(m);
  const float alpha = 0.75f;
  const bool rounded = x.c.math == Math::bf16_inputs;
  const std::vector<float> want_d = gemm_reference(s, A, B, C, bias, alpha, rounded);
  DeviceBuffer<float> d_a(A), d_b(B), d_c(C), d_bias(bias), d_d(sd * s.batch);
  if (rounded) x.gemm.reserve_bf16(std::max(sa, sb) * s.batch);
  x.gemm.run(d_d.get(), d_a.get(), d_b.get(), s.beta != 0.0f ? d_c.get() : nullptr, m, n, k, s.trans_a, s.trans_b, alpha,
             s.beta, s.bias ? d_bias.get() : nullptr, s.batch, s.batch > 1 ? int64_t(sa) : 0,
             s.batch > 1 ? int64_t(sb) : 0, s.batch > 1 ? int64_t(sd) : 0);
  x.check.near(x.tag("Gemm::run D"), d_d.download(), want_d, x.c.tol.fwd);
  if (!rounded) return;
  // A second engine on the same stream, on the first one's bf16 scratch: the same product.
  setenv("KILTER_CUDA_BF16_INPUTS", "1", 1);
  kc::Gemm second(x.gemm.stream(), kc::GemmMath::bf16);
  unsetenv("KILTER_CUDA_BF16_INPUTS");
  second.share_bf16_scratch(x.gemm);
  DeviceBuffer<float> d_again(sd * s.batch);
  second.run(d_again.get(), d_a.get(), d_b.get(), s.beta != 0.0f ? d_c.get() : nullptr, m, n, k, s.trans_a, s.trans_b,
             alpha, s.beta, s.bias ? d_bias.get() : nullptr, s.batch, s.batch > 1 ? int64_t(sa) : 0,
             s.batch > 1 ? int64_t(sb) : 0, s.batch > 1 ? int64_t(sd) : 0);
  x.check.near(x.tag("Gemm::run D on a shared bf16 scratch"), d_again.download(), want_d, x.c.tol.fwd);
}

void run_gelu(CaseContext& x) {
  const size_t N = x.c.shape.N;
  const auto inp = random_floats(N, 4.0f);
  std::vector<float> out(N);
  km::gelu_forward(out.data(), inp.data(), N);
  DeviceBuffer<float> d_inp(inp), d_out(N);
  kc::gelu_forward(d_out.get(), d_inp.get(), N, x.stream());
  x.check.near(x.tag("gelu_forward"), d_out.download(), out, x.c.tol.fwd);
  const auto dout = random_floats(N);
  auto dinp = random_floats(N);  // accumulated onto
  DeviceBuffer<float> d_dout(dout), d_dinp(dinp);
  km::gelu_backward(dinp.data(), inp.data(), dout.data(), N);
  kc::gelu_backward(d_dinp.get(), d_inp.get(), d_dout.get(), N, x.stream());
  x.check.near(x.tag("gelu_backward (accumulated)"), d_dinp.download(), dinp, x.c.tol.bwd);
  std::vector<float> dinp_new = dout;
  km::gelu_backward_inplace(dinp_new.data(), inp.data(), N);
  kc::gelu_backward(d_dinp.get(), d_inp.get(), d_dout.get(), N, x.stream(), /*accumulate=*/false);
  x.check.near(x.tag("gelu_backward (overwritten)"), d_dinp.download(), dinp_new, x.c.tol.bwd);
}

// The CPU twin's form (accumulating, the loss returned), then the model's: in place, overwriting,
// rows without a target zeroed, the scale read from device memory (as CUDA graphs replay it).
void run_crossentropy(CaseContext& x) {
  const int N = x.c.shape.N, V = x.c.shape.V;
  const auto logits = random_floats(size_t(N) * V, 5.0f);
  std::vector<int32_t> targets(N);
  for (int i = 0; i < N; ++i) targets[i] = i % 5 == 4 ? -1 : random_int(0, V - 1);
  const float scale = 1.0f / 29.0f;
  auto dlogits = random_floats(logits.size());
  DeviceBuffer<float> d_logits(logits), d_dlogits(dlogits);
  DeviceBuffer<int32_t> d_targets(targets);
  const double loss = km::crossentropy_forward_backward(dlogits.data(), logits.data(), targets.data(), N, V, scale);
  const double loss_gpu =
      kc::crossentropy_forward_backward(d_dlogits.get(), d_logits.get(), d_targets.get(), N, V, scale, x.stream());
  x.check.near_scalar(x.tag("crossentropy loss"), loss_gpu, loss, x.c.tol.scalar);
  x.check.near(x.tag("crossentropy dlogits (accumulated)"), d_dlogits.download(), dlogits, x.c.tol.bwd);
  for (bool scale_on_device : {false, true}) {
    const std::string how = scale_on_device ? " (scale from device memory)" : "";
    std::vector<float> inplace = logits;
    const double loss_inplace = km::crossentropy_forward_backward_inplace(inplace.data(), targets.data(), N, V, scale);
    for (int i = 0; i < N; ++i)  // rows without a target: 0 (the device overwrites them)
      if (targets[i] < 0) std::fill(inplace.begin() + size_t(i) * V, inplace.begin() + size_t(i + 1) * V, 0.0f);
    DeviceBuffer<float> d_work(logits), d_scale(std::vector<float>{scale});
    DeviceBuffer<double> d_loss(std::vector<double>{0.0});
    kc::crossentropy_forward_backward_async(d_work.get(), d_work.get(), d_targets.get(), N, V,
                                            scale_on_device ? 1234.0f : scale, d_loss.get(), false, x.stream(),
                                            scale_on_device ? d_scale.get() : nullptr);
    x.check.near_scalar(x.tag("crossentropy in-place loss" + how), d_loss.download()[0], loss_inplace,
                        x.c.tol.scalar);
    x.check.near(x.tag("crossentropy in-place dlogits" + how), d_work.download(), inplace, x.c.tol.bwd);
  }
}

void run_adamw(CaseContext& x) {
  const size_t n = x.c.shape.N;
  auto params = random_floats(n), m = random_floats(n, 0.01f), v = random_floats(n, 0.01f);
  for (float& value : v) value = std::fabs(value);
  const auto grads = random_floats(n);
  DeviceBuffer<float> d_p(params), d_g(grads), d_m(m), d_v(v);
  optim::adamw_update(params.data(), grads.data(), m.data(), v.data(), n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, 3);
  kc::adamw_update(d_p.get(), d_g.get(), d_m.get(), d_v.get(), n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, 3,
                   x.stream());
  x.check.near(x.tag("adamw params"), d_p.download(), params, x.c.tol.fwd);
  x.check.near(x.tag("adamw m"), d_m.download(), m, x.c.tol.fwd);
  x.check.near(x.tag("adamw v"), d_v.download(), v, x.c.tol.fwd);
  double expected = 0.0;
  for (float g : grads) expected += static_cast<double>(g) * g;
  DeviceBuffer<double> result(1), scratch(kc::sum_of_squares_scratch_doubles());
  kc::sum_of_squares_async(result.get(), d_g.get(), n, scratch.get(), x.stream());
  x.check.near_scalar(x.tag("sum_of_squares (global norm)"), result.download()[0], expected, x.c.tol.scalar);
}

// AdamW and the squared norm over owned ranges of a layout, one launch each, against the CPU
// AdamW per part; the bf16 copy written in the same pass is the rounding of the update.
void run_adamw_segments(CaseContext& x) {
  const Shape& s = x.c.shape;
  km::ModelSpec spec;
  spec.n_layer = s.layers, spec.n_head = s.NH, spec.n_embd = s.C, spec.block_size = s.context;
  spec.vocab_size = s.V;
  const km::ParamLayout layout = km::ParamLayout::build(spec, 64);
  const size_t P = layout.padded_size, third = P / 3;
  const std::vector<km::ParamRange> owned = {{0, third}, {2 * third, P - 2 * third}};
  std::vector<kc::AdamWSegment> segments;
  uint64_t total = 0;
  km::for_each_owned_part(layout, owned, [&](size_t lo, size_t hi, size_t k, bool decay) {
    segments.push_back({lo, hi, k, total, decay ? 1.0f : 0.0f});
    total += hi - lo;
  });
  const size_t moments = third + (P - 2 * third);
  auto params = random_floats(P), m = random_floats(moments, 0.01f), v = random_floats(moments, 0.01f);
  for (float& value : v) value = std::fabs(value);
  const auto grads = random_floats(P);
  DeviceBuffer<float> d_p(params), d_g(grads), d_m(m), d_v(v);
  DeviceBuffer<kc::AdamWSegment> d_segments(segments);
  DeviceBuffer<kc::bf16> d_copy(P);
  double norm = 0.0;
  for (const kc::AdamWSegment& seg : segments) {
    optim::adamw_update(params.data() + seg.lo, grads.data() + seg.lo, m.data() + seg.moment, v.data() + seg.moment,
                        seg.hi - seg.lo, 1e-2f, 0.9f, 0.95f, 1e-8f, seg.decay != 0 ? 0.3f : 0.0f, 0.7f, 4);
    for (uint64_t i = seg.lo; i < seg.hi; ++i) norm += double(grads[i]) * grads[i];
  }
  kc::adamw_update_segments(d_p.get(), d_g.get(), d_m.get(), d_v.get(), d_segments.get(), int(segments.size()), total,
                            1e-2f, 0.9f, 0.95f, 1e-8f, 0.3f, 0.7f, 4, x.stream(), d_copy.get());
  const std::vector<float> got = d_p.download();
  x.check.near(x.tag("AdamW over owned ranges, one launch: params"), got, params, x.c.tol.fwd);
  x.check.near(x.tag("AdamW over owned ranges, one launch: m"), d_m.download(), m, x.c.tol.fwd);
  x.check.near(x.tag("AdamW over owned ranges, one launch: v"), d_v.download(), v, x.c.tol.fwd);
  const std::vector<kc::bf16> copy = d_copy.download();
  bool copy_ok = true;
  for (const kc::AdamWSegment& seg : segments)
    for (uint64_t i = seg.lo; i < seg.hi; ++i) copy_ok = copy_ok && km::round_bf16(got[i]) == __bfloat162float(copy[i]);
  x.check.expect(x.tag("AdamW writes the bf16 copy of every updated parameter"), copy_ok);
  DeviceBuffer<double> result(1), scratch(kc::sum_of_squares_scratch_doubles());
  DeviceBuffer<unsigned> counter(1);
  for (int round = 0; round < 2; ++round) {  // the kernel leaves its counter ready for the next call
    kc::sum_of_squares_segments(result.get(), d_g.get(), d_segments.get(), int(segments.size()), total, scratch.get(),
                                counter.get(), x.stream());
    x.check.near_scalar(x.tag("squared norm over owned ranges (call " + std::to_string(round + 1) + ")"),
                        result.download()[0], norm, x.c.tol.scalar);
  }
}

void run_swiglu(CaseContext& x) {
  const int N = x.c.shape.N, F = x.c.shape.OC;
  const auto inp = random_floats(size_t(N) * 2 * F, 3.0f), dout = random_floats(size_t(N) * F);
  std::vector<float> out(size_t(N) * F), dinp(inp.size());
  km::swiglu_forward(out.data(), inp.data(), N, F);
  km::swiglu_backward(dinp.data(), dout.data(), inp.data(), N, F);
  DeviceBuffer<float> d_inp(inp), d_dout(dout), d_out(out.size()), d_dinp(random_floats(inp.size()));
  kc::swiglu_forward(d_out.get(), d_inp.get(), N, F, x.stream());
  kc::swiglu_backward(d_dinp.get(), d_dout.get(), d_inp.get(), N, F, x.stream());
  x.check.near(x.tag("swiglu_forward"), d_out.download(), out, x.c.tol.fwd);
  x.check.near(x.tag("swiglu_backward (overwritten)"), d_dinp.download(), dinp, x.c.tol.bwd);
}

}  // namespace

// RoPE on q|k|v rows of pieces with offsets (a later part continues its piece's positions), in
// place, forward and backward; fp32 rows against the twin, bf16 rows against its rounding.
void run_rope_rows(CaseContext& x, bool bf16_rows) {
  const Shape& s = x.c.shape;
  km::ModelSpec spec;
  spec.arch = "llama";
  spec.n_head = s.NH, spec.n_kv_head = s.NKV, spec.n_embd = s.NH * s.hd, spec.block_size = s.context;
  spec.vocab_size = s.V;
  spec.rope_scaling = "llama3";
  spec.rope_original_context = 16;
  const km::AttentionShape shape{s.NH, s.NKV, s.hd};
  const km::RopeTable table = km::RopeTable::build(spec, spec.block_size);
  const std::vector<int32_t> cu = offsets_of(s.lengths);
  const int N = cu.back(), pieces = static_cast<int>(s.lengths.size()), W = shape.row_width();
  std::vector<int32_t> positions(N);
  km::piece_positions(positions.data(), cu.data(), pieces, s.offsets.empty() ? nullptr : s.offsets.data());
  DeviceBuffer<float> d_cos(table.cos), d_sin(table.sin);
  DeviceBuffer<int32_t> d_cu(cu), d_offset(s.offsets);
  const int32_t* offset = s.offsets.empty() ? nullptr : d_offset.get();
  for (bool backward : {false, true}) {
    const std::string what = backward ? "rope_backward" : "rope_forward";
    const std::vector<float> rows = bf16_values(size_t(N) * W, 2.0f);
    std::vector<float> want = rows;
    (backward ? km::rope_backward : km::rope_forward)(want.data(), positions.data(), N, shape, table);
    if (!bf16_rows) {
      DeviceBuffer<float> d_rows(rows);
      if (backward)
        kc::rope_backward(d_rows.get(), d_cu.get(), offset, pieces, N, s.NH, s.NKV, s.hd, d_cos.get(),
                          d_sin.get(), x.stream());
      else
        kc::rope_forward(d_rows.get(), d_cu.get(), offset, pieces, N, s.NH, s.NKV, s.hd, d_cos.get(),
                         d_sin.get(), x.stream());
      x.check.near(x.tag(what + " (fp32 rows)"), d_rows.download(), want, backward ? x.c.tol.bwd : x.c.tol.fwd);
      continue;
    }
    km::round_bf16_inplace(want.data(), want.size());
    Bf16Device b_rows(rows, x.stream());
    if (backward)
      kc::rope_backward(b_rows.get(), d_cu.get(), offset, pieces, N, s.NH, s.NKV, s.hd, d_cos.get(),
                        d_sin.get(), x.stream());
    else
      kc::rope_forward(b_rows.get(), d_cu.get(), offset, pieces, N, s.NH, s.NKV, s.hd, d_cos.get(),
                       d_sin.get(), x.stream());
    x.check.near_bf16(x.tag(what + " (bf16 rows)"), b_rows.download(), want, backward ? x.c.tol.bwd : x.c.tol.fwd,
                      x.c.tol.once);
  }
}

void add_fp32_runners(RunnerMap& runners) {
  runners["encoder"] = run_encoder;
  runners["layernorm"] = run_layernorm;
  runners["rmsnorm"] = run_rmsnorm;
  runners["column_sums"] = run_column_sums;
  runners["matmul"] = run_matmul;
  runners["gemm"] = run_gemm;
  runners["gelu"] = run_gelu;
  runners["crossentropy"] = run_crossentropy;
  runners["adamw"] = run_adamw;
  runners["adamw_segments"] = run_adamw_segments;
  runners["rope"] = [](CaseContext& x) { run_rope_rows(x, false); };
  runners["swiglu"] = run_swiglu;
}

}  // namespace kilter::optable
