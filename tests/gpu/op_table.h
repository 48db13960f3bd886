// The op table: every CUDA kernel of the model (the declarations of namespace
// kilter::model::cuda) as rows of op family x dtype x shape, each row with its tolerance, as
// ggml's test-backend-ops lists its cases. tests/gpu/gpu_op_table_test.cpp runs every row on every
// compiled device backend against the CPU twin; tests/unit/op_table_cpu_test.cpp reads the same
// rows on a machine without a device: that every declared kernel has a row, and that each bf16
// twin stays within its row's tolerance of the fp32 op. Plain data, no CUDA: both builds use it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace kilter::optable {

// The storage of a case's activations: fp32, or bf16 (the bf16-storage datapath's kernels).
enum class Dtype { fp32, bf16 };
// The math of a case's GEMMs (cuda_ops.h GemmMath): fp32, fast-bf16 on fp32 operands, or the
// fp32 operands first rounded into bf16 scratch (KILTER_CUDA_BF16_INPUTS=1).
enum class Math { fp32, bf16, bf16_inputs };

// The sizes of a case; each family reads the ones it names.
struct Shape {
  int N = 0, C = 0, OC = 0;           // rows, input and output width
  int V = 0, Vp = 0, R = 0;           // vocabulary, padded vocabulary, classifier rows per chunk
  int B = 0, T = 0, NH = 0, NKV = 0;  // a padded attention group: rows, length, query and K/V heads
  int hd = 0;                         // head_dim (0: C / NH)
  int s = 0, L = 0;                   // a later part of a cut piece: prefix rows, own rows
  int context = 0;                    // rows of the position table / longest piece
  int layers = 0;                     // AdamW over a model's layout: its layers
  std::vector<int32_t> lengths;       // packed pieces, or an attention group's rows (empty: random)
  std::vector<int32_t> offsets;       // the pieces' position offsets (empty: none)
  size_t budget = 0;                  // bf16 attention: score floats per chunk
  bool rms = false;                   // norms: RMSNorm (else LayerNorm)
  bool position_table = true;         // encoder: wpe (false: the Llama family, none)
  bool trans_a = false, trans_b = false, bias = false;  // raw GEMM
  float beta = 0.0f;
  int batch = 1;
};

// Error bounds of a case: max |device - cpu| / max |cpu| of each tensor, per kind of output,
// and for bf16 outputs the least share of elements equal bit for bit (the kernel rounds where its
// twin does; summation orders differ only in fp32, so a value within an fp32 rounding of a bf16
// boundary may round the other way). 0 where a case has no output of that kind.
struct Tolerance {
  double fwd = 0;      // forward outputs in the case's dtype
  double bwd = 0;      // backward outputs in the case's dtype
  double fp32 = 0;     // fp32 side outputs: saved statistics, fp32 gradients of bf16 ops, dbias sums
  double scalar = 0;   // scalar results (losses, squared norms), relative
  double once = 0;     // bf16 values rounded once from fp32 math: least bit-for-bit share
  double chained = 0;  // bf16 values whose inputs went through other roundings
};

struct OpCase {
  std::string family;  // OpFamily::name
  Dtype dtype = Dtype::fp32;
  Math math = Math::fp32;
  Shape shape;
  Tolerance tol;
  std::string label;  // what the shape exercises, part of the test's name (letters, digits, _)
  std::string name() const;  // family[_dtype][_math]_label (the dtype where the family's name lacks it)
};

// An op family: the kernels one case of it calls (forward and backward), by their declared
// names: "name" for a function declared once, "name(fp32)" / "name(bf16)" for an overload on
// fp32 or bf16 rows, "Class::method" for a member.
struct OpFamily {
  std::string name;
  Dtype dtype = Dtype::fp32;  // of its rows
  std::vector<std::string> kernels;
  std::string twin;  // the CPU twin it is compared with
};

// GoogleTest prints a row by its name.
inline void PrintTo(const OpCase& c, std::ostream* os) { *os << c.name(); }

const std::vector<OpFamily>& op_families();
const std::vector<OpCase>& op_cases();
const OpFamily* find_family(const std::string& name);

// Declarations of namespace kilter::model::cuda that a row of this table does not run, each
// with the test that does: the cuDNN SDPA engine needs its plans and its own binary.
struct CoveredElsewhere {
  std::string kernel;
  std::string test;
};
const std::vector<CoveredElsewhere>& covered_elsewhere();

const char* dtype_name(Dtype dtype);
const char* math_name(Math math);

}  // namespace kilter::optable
