// The rows of the op table (op_table.h): the families, with the kernels each runs, and the cases,
// with their shapes and tolerances. Shapes mix odd sizes (tails, unaligned GEMM operands, head_dim
// 6) with aligned ones (tensor-core friendly, the cuBLASLt epilogues), pieces of length 1, ragged
// attention rows and later parts of cut pieces; grouped K/V heads for the Llama family.
#include "tests/gpu/op_table.h"

#include <algorithm>
#include <cctype>

namespace kilter::optable {

namespace {

// Tolerances, error relative to each CPU tensor's max |value|:
constexpr double kRow = 1e-5;   // elementwise and row ops in fp32 (one summation order apart)
constexpr double kGemm = 1e-4;  // fp32 GEMM-based ops (cuBLASLt's summation order)
constexpr double kFastBf16 = 3e-2;  // fp32 operands multiplied as bf16 (GemmMath::bf16)
constexpr double kBf16 = 1e-2;  // bf16 outputs against twins that round at the same points (~2 ulps)
constexpr double kOnce = 0.98;  // bit-for-bit share of a bf16 value rounded once
constexpr double kChained = 0.9;  // of one whose inputs went through other bf16 roundings

Tolerance rows(double tol) { return {tol, tol, tol, tol, 0, 0}; }
Tolerance exact() { return {0, 0, 0, 0, 1.0, 1.0}; }
Tolerance bf16_rows(double fp32_side = kRow) { return {kBf16, kBf16, fp32_side, 0, kOnce, kOnce}; }

OpCase row(const std::string& family, Dtype dtype, Math math, const std::string& label, Shape shape, Tolerance tol) {
  OpCase c;
  c.family = family;
  c.dtype = dtype;
  c.math = math;
  c.label = label;
  c.shape = std::move(shape);
  c.tol = tol;
  return c;
}

Shape rows_cols(int N, int C, int OC = 0) {
  Shape s;
  s.N = N, s.C = C, s.OC = OC;
  return s;
}

Shape pieces(std::vector<int32_t> lengths, std::vector<int32_t> offsets, int C, int V, int context) {
  Shape s;
  s.lengths = std::move(lengths), s.offsets = std::move(offsets);
  s.C = C, s.V = V, s.context = context;
  return s;
}

// A padded attention group (B rows of length T; lengths empty: random, the first full).
Shape group(int B, int T, int NH, int NKV, int hd, std::vector<int32_t> lengths = {}) {
  Shape s;
  s.B = B, s.T = T, s.NH = NH, s.NKV = NKV, s.hd = hd, s.C = NH * hd;
  s.lengths = std::move(lengths);
  return s;
}

Shape prefix(int s_rows, int L, int NH, int NKV, int hd) {
  Shape s;
  s.s = s_rows, s.L = L, s.NH = NH, s.NKV = NKV, s.hd = hd, s.C = NH * hd;
  return s;
}

Shape gemm(int m, int n, int k, bool trans_a, bool trans_b, bool bias, float beta, int batch) {
  Shape s;
  s.OC = m, s.N = n, s.C = k;
  s.trans_a = trans_a, s.trans_b = trans_b, s.bias = bias, s.beta = beta, s.batch = batch;
  return s;
}

std::vector<OpCase> build_cases() {
  const Dtype f = Dtype::fp32, h = Dtype::bf16;
  const Math m32 = Math::fp32, m16 = Math::bf16;
  std::vector<OpCase> t;
  // ---- fp32 kernels: GPT-2's and the Llama family's --------------------------------------------
  t.push_back(row("encoder", f, m32, "packed", pieces({13, 1, 7, 13, 4}, {}, 37, 61, 13), rows(kRow)));
  t.push_back(row("encoder", f, m32, "offsets", pieces({13, 1, 7, 9}, {0, 30, 5, 31}, 37, 61, 40), rows(kRow)));
  Shape no_wpe = pieces({13, 1, 7, 9}, {0, 30, 5, 31}, 37, 61, 40);
  no_wpe.position_table = false;
  t.push_back(row("encoder", f, m32, "llama_no_position_table", no_wpe, rows(kRow)));
  t.push_back(row("layernorm", f, m32, "N150_C67", rows_cols(150, 67), rows(kRow)));
  t.push_back(row("rmsnorm", f, m32, "N150_C67", rows_cols(150, 67), rows(kRow)));
  t.push_back(row("column_sums", f, m32, "N150_C67", rows_cols(150, 67), rows(kRow)));
  // matmul: fwd/bwd at the GEMM's tolerance, dbias (column sums) at the row ops'.
  t.push_back(row("matmul", f, m32, "odd_45x37x29", rows_cols(45, 37, 29), {kGemm, kGemm, kRow, 0, 0, 0}));
  t.push_back(row("matmul", f, m32, "aligned_256x128x384", rows_cols(256, 128, 384), {kGemm, kGemm, kRow, 0, 0, 0}));
  t.push_back(row("matmul", f, m16, "aligned_256x128x384", rows_cols(256, 128, 384),
                  {kFastBf16, kFastBf16, kRow, 0, 0, 0}));
  t.push_back(row("gemm", f, m32, "nn_bias_33x17x29", gemm(33, 17, 29, false, false, true, 0.0f, 1), rows(kGemm)));
  t.push_back(row("gemm", f, m32, "tn_beta_batched", gemm(24, 19, 40, true, false, false, 0.5f, 3), rows(kGemm)));
  t.push_back(row("gemm", f, m32, "nt_beta_bias", gemm(64, 32, 48, false, true, true, 1.0f, 1), rows(kGemm)));
  t.push_back(row("gemm", f, m16, "tn_bias_128x64x96", gemm(128, 64, 96, true, false, true, 0.0f, 1),
                  rows(kFastBf16)));
  // Operands rounded to bf16 first: against the product of the rounded operands (exact products).
  t.push_back(row("gemm", f, Math::bf16_inputs, "tn_batched", gemm(128, 64, 96, true, false, false, 0.0f, 2),
                  rows(kGemm)));
  t.push_back(row("attention", f, m32, "B3_T17_C24_NH4_hd6", group(3, 17, 4, 4, 6), rows(kGemm)));
  t.push_back(row("attention", f, m32, "B2_T64_C128_NH2", group(2, 64, 2, 2, 64), rows(kGemm)));
  t.push_back(row("attention", f, m16, "B2_T64_C128_NH2", group(2, 64, 2, 2, 64), rows(kFastBf16)));
  t.push_back(row("attention", f, m32, "gqa_NH6_NKV2_hd8", group(3, 19, 6, 2, 8, {19, 1, 11}), rows(kGemm)));
  t.push_back(row("attention_heads", f, m32, "mha_B3_T17_NH4_hd6", group(3, 17, 4, 4, 6), exact()));
  t.push_back(row("attention_heads", f, m32, "gqa_B2_T9_NH6_NKV2", group(2, 9, 6, 2, 8), exact()));
  Shape packed = group(0, 0, 4, 4, 6);
  packed.context = 70;
  t.push_back(row("packed_attention", f, m32, "C24_NH4_context70", packed, rows(kGemm)));
  t.push_back(row("prefix_attention", f, m32, "s37_L70_C24_NH4", prefix(37, 70, 4, 4, 6), rows(kGemm)));
  t.push_back(row("prefix_attention", f, m32, "s1_L5_C128_NH2", prefix(1, 5, 2, 2, 64), rows(kGemm)));
  t.push_back(row("prefix_attention", f, m16, "s200_L64_C128_NH2", prefix(200, 64, 2, 2, 64), rows(kFastBf16)));
  t.push_back(row("prefix_attention", f, m32, "gqa_s23_L17_NH6_NKV2", prefix(23, 17, 6, 2, 8), rows(kGemm)));
  t.push_back(row("cudnn_attention", f, m32, "B3_T17_C24_NH4_hd6", group(3, 17, 4, 4, 6), rows(kGemm)));
  t.push_back(row("cudnn_attention", f, m32, "B2_T64_C128_NH2", group(2, 64, 2, 2, 64), rows(kGemm)));
  t.push_back(row("cudnn_attention", f, m32, "B2_T256_C128_NH2", group(2, 256, 2, 2, 64), rows(kGemm)));
  t.push_back(row("cudnn_attention", f, m16, "B2_T64_C128_NH2", group(2, 64, 2, 2, 64), rows(kFastBf16)));
  t.push_back(row("gelu", f, m32, "n10007", rows_cols(10007, 1), rows(kRow)));
  Shape ce = rows_cols(37, 0);
  ce.V = 1031;
  t.push_back(row("crossentropy", f, m32, "N37_V1031", ce, rows(kRow)));
  t.push_back(row("adamw", f, m32, "n100003", rows_cols(100003, 1), {kRow, kRow, kRow, 1e-12, 0, 0}));
  Shape layout;
  layout.layers = 2, layout.NH = 2, layout.C = 24, layout.context = 16, layout.V = 37;
  t.push_back(row("adamw_segments", f, m32, "gpt2_2x24_two_ranges", layout, {kRow, kRow, kRow, 1e-12, 1.0, 1.0}));
  Shape rope = pieces({13, 1, 20, 9}, {0, 30, 5, 40}, 32, 32, 64);
  rope.NH = 4, rope.NKV = 2, rope.hd = 8;
  t.push_back(row("rope", f, m32, "offsets_NH4_NKV2_hd8", rope, rows(kRow)));
  t.push_back(row("swiglu", f, m32, "N37_F45", rows_cols(37, 0, 45), rows(kRow)));

  // ---- the bf16-storage datapath's kernels ------------------------------------------------------
  t.push_back(row("rope_bf16", h, m16, "offsets_NH4_NKV2_hd8", rope, bf16_rows()));
  t.push_back(row("swiglu_bf16", h, m16, "N37_F45", rows_cols(37, 0, 45), bf16_rows()));
  t.push_back(row("encoder_bf16", h, m16, "offsets", pieces({13, 1, 7, 9}, {0, 30, 5, 31}, 40, 61, 40), bf16_rows()));
  Shape no_wpe16 = pieces({13, 1, 7, 9}, {0, 30, 5, 31}, 40, 61, 40);
  no_wpe16.position_table = false;
  t.push_back(row("encoder_bf16", h, m16, "llama_no_position_table", no_wpe16, bf16_rows()));
  Shape norm = rows_cols(30, 40);
  t.push_back(row("residual_norm_bf16", h, m16, "layernorm_N30_C40", norm, bf16_rows()));
  norm.rms = true;
  t.push_back(row("residual_norm_bf16", h, m16, "rmsnorm_N30_C40", norm, bf16_rows()));
  // The odd shape has no epilogue kernel (aux rows not a multiple of 8): the fallbacks run.
  t.push_back(row("linear_bf16", h, m16, "odd_fallbacks_45x37x29", rows_cols(45, 37, 29), bf16_rows(kGemm)));
  t.push_back(row("linear_bf16", h, m16, "epilogues_256x128x384", rows_cols(256, 128, 384), bf16_rows(kGemm)));
  t.push_back(row("gelu_bf16", h, m16, "n1305", rows_cols(1305, 1), bf16_rows()));
  t.push_back(row("gelu_bf16", h, m16, "n98304", rows_cols(98304, 1), bf16_rows()));
  t.push_back(row("column_sums_bf16", h, m16, "N45_C29", rows_cols(45, 29), rows(kRow)));
  t.push_back(row("column_sums_bf16", h, m16, "N256_C384", rows_cols(256, 384), rows(kRow)));
  const Tolerance attention16{kBf16, 2 * kBf16, 2 * kBf16, 0, kOnce, kChained};
  Shape one_chunk = group(3, 17, 4, 4, 6);
  one_chunk.budget = size_t(1) << 20;
  t.push_back(row("attention_bf16", h, m16, "hd6_one_chunk", one_chunk, attention16));
  Shape row_chunks = group(5, 64, 8, 2, 16);
  row_chunks.budget = 8 * 64 * 64;
  t.push_back(row("attention_bf16", h, m16, "gqa_NH8_NKV2_row_chunks", row_chunks, attention16));
  t.push_back(row("prefix_attention_bf16", h, m16, "s37_L70_NH4_hd6", prefix(37, 70, 4, 4, 6), attention16));
  t.push_back(row("prefix_attention_bf16", h, m16, "gqa_s200_L64_NH8_NKV2", prefix(200, 64, 8, 2, 16), attention16));
  Shape head = rows_cols(150, 40);
  head.V = 257, head.Vp = 384, head.R = 64;
  t.push_back(row("classifier_chunks_bf16", h, m16, "N150_V257_Vp384_R64", head,
                  {kBf16, kBf16, 1e-3, 1e-4, kOnce, kChained}));
  Shape logits = rows_cols(37, 0);
  logits.V = 1031, logits.Vp = 1152;
  t.push_back(row("classifier_rows_bf16", h, m16, "R37_V1031_Vp1152", logits, {kBf16, kBf16, kRow, 1e-12, kOnce, kOnce}));
  t.push_back(row("convert_bf16", h, m16, "n1000", rows_cols(1000, 1), {kBf16, kBf16, 0, 0, 1.0, 1.0}));
  t.push_back(row("padded_rows_bf16", h, m16, "W13_two_padding_rows", rows_cols(5, 13), exact()));
  Shape params = rows_cols(100, 8);
  params.V = 37, params.Vp = 128;
  t.push_back(row("round_params_bf16", h, m16, "V37_C8_Vp128", params, exact()));
  Shape strided = rows_cols(7, 13);
  strided.OC = 20;  // the strided side's leading dimension
  t.push_back(row("strided_rows_bf16", h, m16, "rows7_cols13_ld20", strided, exact()));
  return t;
}

std::vector<OpFamily> build_families() {
  const Dtype f = Dtype::fp32, h = Dtype::bf16;
  return {
      {"encoder", f, {"encoder_forward", "encoder_backward"}, "lib/model/encoder.h"},
      {"layernorm", f, {"layernorm_forward", "layernorm_backward"}, "lib/model/layernorm.h"},
      {"rmsnorm", f, {"rmsnorm_forward", "rmsnorm_backward"}, "lib/model/rmsnorm.h"},
      {"column_sums", f, {"column_sums_accumulate(fp32)", "column_sum_scratch_floats"}, "a double sum per column"},
      {"matmul", f, {"matmul_forward", "matmul_forward_residual", "matmul_backward"}, "lib/model/matmul.h"},
      {"gemm", f, {"Gemm::run", "Gemm::stream", "Gemm::math", "Gemm::reserve_bf16", "Gemm::share_bf16_scratch"},
       "a column-major product in double"},
      {"attention", f, {"attention_workspace_floats", "attention_forward", "attention_backward"},
       "lib/model/attention.h on the packed real rows"},
      {"attention_heads", f,
       {"attention_split_heads", "attention_merge_heads", "attention_split_grad", "attention_merge_qkv_grad"},
       "the head layout (AttentionShape) as index arithmetic"},
      {"packed_attention", f,
       {"gather_padded_rows(fp32)", "scatter_padded_rows(fp32)", "attention_forward", "attention_backward"},
       "lib/model/attention.h with model::AttentionGroups"},
      {"prefix_attention", f,
       {"attention_prefix_workspace_floats", "attention_prefix_forward", "attention_prefix_backward"},
       "lib/model/attention.h with an AttentionPrefix"},
      {"cudnn_attention", f,
       {"CudnnAttention::supports", "CudnnAttention::reserve_floats", "CudnnAttention::workspace_floats",
        "CudnnAttention::forward", "CudnnAttention::backward", "CudnnAttention::description"},
       "lib/model/attention.h on the packed real rows"},
      {"gelu", f, {"gelu_forward(fp32)", "gelu_backward"}, "lib/model/gelu.h"},
      {"crossentropy", f, {"crossentropy_forward_backward", "crossentropy_forward_backward_async"},
       "lib/model/crossentropy.h"},
      {"adamw", f, {"adamw_update", "sum_of_squares_scratch_doubles", "sum_of_squares_async"},
       "lib/optim/adamw.h"},
      {"adamw_segments", f, {"adamw_update_segments", "sum_of_squares_segments"},
       "lib/optim/adamw.h per owned part (model::for_each_owned_part)"},
      {"rope", f, {"rope_forward(fp32)", "rope_backward(fp32)"}, "lib/model/rope.h"},
      {"swiglu", f, {"swiglu_forward(fp32)", "swiglu_backward(fp32)"}, "lib/model/swiglu.h"},
      {"rope_bf16", h, {"rope_forward(bf16)", "rope_backward(bf16)"}, "lib/model/rope.h, rounded"},
      {"swiglu_bf16", h, {"swiglu_forward(bf16)", "swiglu_backward(bf16)"}, "lib/model/bf16_ops.h"},
      {"encoder_bf16", h, {"encoder_forward_bf16(fp32)", "encoder_forward_bf16(bf16)"}, "lib/model/encoder.h, rounded"},
      {"residual_norm_bf16", h, {"residual_norm_forward_bf16", "norm_backward_bf16"}, "lib/model/bf16_ops.h"},
      {"linear_bf16", h, {"linear_forward_bf16", "linear_backward_bf16", "linear_scratch_floats", "Gemm::run_typed",
                          "gemm_call"},
       "lib/model/bf16_ops.h"},
      {"gelu_bf16", h, {"gelu_forward(bf16)", "gelu_backward_inplace"}, "lib/model/bf16_ops.h, gelu.h rounded"},
      {"column_sums_bf16", h, {"column_sums_accumulate(bf16)", "column_sum_scratch_floats"},
       "a sum per column"},
      {"attention_bf16", h, {"attention_bf16_workspace_bytes", "attention_bf16_forward", "attention_bf16_backward"},
       "lib/model/attention_bf16.h on the packed real rows"},
      {"prefix_attention_bf16", h,
       {"attention_prefix_bf16_workspace_bytes", "attention_prefix_bf16_forward", "attention_prefix_bf16_backward"},
       "lib/model/attention_bf16.h with an AttentionPrefix"},
      {"classifier_chunks_bf16", h, {"classifier_chunks_bf16", "classifier_bf16", "sum_row_losses"},
       "lib/model/bf16_ops.h classifier_bf16"},
      {"classifier_rows_bf16", h, {"classifier_bf16", "sum_row_losses"},
       "lib/model/crossentropy.h on the bf16 logits, rounded"},
      {"convert_bf16", h, {"to_bf16", "to_float", "round_bf16_inplace", "add_into_bf16"}, "model::round_bf16"},
      {"padded_rows_bf16", h, {"gather_padded_rows(bf16)", "scatter_padded_rows(bf16)"}, "row copies"},
      {"round_params_bf16", h, {"round_params_bf16"}, "model::round_bf16"},
      {"strided_rows_bf16", h, {"rows_to_bf16", "rows_to_fp32", "rows_copy_bf16"}, "model::round_bf16"},
  };
}

}  // namespace

const char* dtype_name(Dtype dtype) { return dtype == Dtype::fp32 ? "fp32" : "bf16"; }

const char* math_name(Math math) {
  switch (math) {
    case Math::fp32: return "fp32";
    case Math::bf16: return "bf16";
    case Math::bf16_inputs: return "bf16_inputs";
  }
  return "?";
}

std::string OpCase::name() const {
  const std::string suffix = std::string("_") + dtype_name(dtype);
  const bool named = family.size() > suffix.size() && family.compare(family.size() - suffix.size(), suffix.size(), suffix) == 0;
  std::string out = named ? family : family + suffix;
  if (dtype == Dtype::fp32 && math != Math::fp32) out += std::string("_") + math_name(math) + "_math";
  out += "_" + label;
  for (char& c : out)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return out;
}

const std::vector<OpFamily>& op_families() {
  static const std::vector<OpFamily> families = build_families();
  return families;
}

const std::vector<OpCase>& op_cases() {
  static const std::vector<OpCase> cases = build_cases();
  return cases;
}

const OpFamily* find_family(const std::string& name) {
  for (const OpFamily& family : op_families())
    if (family.name == name) return &family;
  return nullptr;
}

const std::vector<CoveredElsewhere>& covered_elsewhere() {
  static const std::vector<CoveredElsewhere> list = {
      {"SdpaAttention::prepare", "kilter_gpu_sdpa_test"},
      {"SdpaAttention::workspace_bytes", "kilter_gpu_sdpa_test"},
      {"SdpaAttention::forward", "kilter_gpu_sdpa_test"},
      {"SdpaAttention::backward", "kilter_gpu_sdpa_test"},
      {"SdpaAttention::build_stats", "kilter_gpu_sdpa_test"},
      {"SdpaAttention::description", "kilter_gpu_sdpa_test"},
      {"sdpa_validate_graphs", "backend_sdpa_graph_test (validates on the CPU) and kilter_gpu_sdpa_test"},
      {"sdpa_stage_keys(fp32)", "kilter_gpu_sdpa_test"},
      {"sdpa_stage_keys(bf16)", "kilter_gpu_sdpa_test"},
      {"sdpa_unstage_key_grads(fp32)", "kilter_gpu_sdpa_test"},
      {"sdpa_unstage_key_grads(bf16)", "kilter_gpu_sdpa_test"},
  };
  return list;
}

}  // namespace kilter::optable
