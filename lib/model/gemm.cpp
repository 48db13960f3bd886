// GEMM engine wrapper and its optional profile (see gemm.h). With oneDNN, fp32 GEMMs go through
// dnnl_sgemm (measured as fast as a cached matmul primitive on kilter's shapes and stateless) and
// bf16 GEMMs through matmul primitives, created once per shape/stride/transposition/scale and
// cached per thread. Both are deterministic for a fixed thread count.
#include "lib/model/gemm.h"

#include <chrono>
#include <cstring>
#include <map>
#include <tuple>
#include <unordered_map>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "io/base/error.h"
#include "lib/model/vecmath.h"

#ifdef KILTER_WITH_ONEDNN
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>
#else
#include <cblas.h>
#endif

namespace kilter::model {
namespace {

bool profile_on = false;
GemmProfile profile;

// Adds one call to the profile when it is on; `run` does the GEMM.
template <typename Run>
void profiled(bool bf16_inputs, bool ta, bool tb, int M, int N, int K, Run&& run) {
  if (!profile_on) {
    run();
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  run();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  profile.seconds += seconds;
  profile.flops += 2.0 * M * N * K;
  profile.calls += 1;
  auto& shape = profile.shapes[GemmShape{bf16_inputs, ta, tb, M, N, K}];
  shape.first += 1;
  shape.second += seconds;
}

#ifdef KILTER_WITH_ONEDNN
dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// One bf16 matmul problem: shapes, strides, transpositions, the scalars baked into the primitive
// and whether it adds a bias.
using Bf16Key = std::tuple<bool, bool, int, int, int, int, int, int, float, float, bool>;

struct Bf16Primitive {
  dnnl::matmul matmul;
  dnnl::memory::desc a, b, c, bias;
};

Bf16Primitive make_bf16_primitive(const Bf16Key& key) {
  const auto [ta, tb, M, N, K, lda, ldb, ldc, alpha, beta, with_bias] = key;
  using dims = dnnl::memory::dims;
  using dt = dnnl::memory::data_type;
  // Row-major op(A) (M,K): A stored (M,K) with row stride lda, or (K,M) transposed.
  const dnnl::memory::desc a({M, K}, dt::bf16, ta ? dims{1, lda} : dims{lda, 1});
  const dnnl::memory::desc b({K, N}, dt::bf16, tb ? dims{1, ldb} : dims{ldb, 1});
  const dnnl::memory::desc c({M, N}, dt::f32, dims{ldc, 1});
  const dnnl::memory::desc bias = with_bias ? dnnl::memory::desc({1, N}, dt::f32, dims{N, 1}) : dnnl::memory::desc();
  dnnl::primitive_attr attr;
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(beta);
    attr.set_post_ops(ops);
  }
  const dnnl::matmul::desc desc = with_bias ? dnnl::matmul::desc(a, b, bias, c) : dnnl::matmul::desc(a, b, c);
  const dnnl::matmul::primitive_desc pd(desc, attr, cpu_engine());
  return Bf16Primitive{dnnl::matmul(pd), a, b, c, bias};
}

// Per thread: a packed-batch run sees a handful of token counts per step, and attention's padded
// blocks about context / 16 shapes per product, so the cache stays small; it is cleared if a long
// run ever accumulates many shapes.
constexpr size_t kMaxCachedPrimitives = 2048;
#endif

}  // namespace

void sgemm_rowmajor(bool transpose_a, bool transpose_b, int M, int N, int K, float alpha, const float* A, int lda,
                    const float* B, int ldb, float beta, float* C, int ldc) {
  profiled(false, transpose_a, transpose_b, M, N, K, [&] {
#ifdef KILTER_WITH_ONEDNN
    // oneDNN's sgemm takes row-major matrices (since v1.0).
    const dnnl_status_t status = dnnl_sgemm(transpose_a ? 'T' : 'N', transpose_b ? 'T' : 'N', M, N, K, alpha, A, lda,
                                            B, ldb, beta, C, ldc);
    KILTER_CHECK(status == dnnl_success, "oneDNN sgemm failed (status " << static_cast<int>(status) << ") on "
                                             << M << "x" << N << "x" << K);
#else
    cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans, transpose_b ? CblasTrans : CblasNoTrans, M, N,
                K, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
  });
}

void gemm_bf16_rowmajor(bool transpose_a, bool transpose_b, int M, int N, int K, float alpha, const bf16* A,
                        int lda, const bf16* B, int ldb, float beta, float* C, int ldc, const float* bias) {
#ifdef KILTER_WITH_ONEDNN
  thread_local std::map<Bf16Key, Bf16Primitive> cache;
  thread_local dnnl::stream stream(cpu_engine());
  // An overwrite without a bias gets a bias of zeros: oneDNN 2.6's bf16 matmul with neither a
  // bias nor a sum ran its overwrite at a third of the rate on AMX (190 against 510-690 GF/s for
  // 2048 x 1408 x 256, Llama's gate|up), and x + 0 is x (a -0 becomes +0, nothing else moves).
  thread_local std::vector<float> zeros;
  if (beta == 0.0f && bias == nullptr) {
    if (zeros.size() < size_t(N)) zeros.assign(size_t(N), 0.0f);
    bias = zeros.data();
  }
  const Bf16Key key{transpose_a, transpose_b, M, N, K, lda, ldb, ldc, alpha, beta, bias != nullptr};
  auto it = cache.find(key);
  if (it == cache.end()) {
    if (cache.size() >= kMaxCachedPrimitives) cache.clear();
    it = cache.emplace(key, make_bf16_primitive(key)).first;
  }
  const Bf16Primitive& p = it->second;
  dnnl::engine& engine = cpu_engine();
  dnnl::memory a(p.a, engine, const_cast<bf16*>(A));
  dnnl::memory b(p.b, engine, const_cast<bf16*>(B));
  dnnl::memory c(p.c, engine, C);
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}};
  if (bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory(p.bias, engine, const_cast<float*>(bias)));
  profiled(true, transpose_a, transpose_b, M, N, K, [&] {
    p.matmul.execute(stream, args);
    stream.wait();
  });
#else
  (void)transpose_a, (void)transpose_b, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B,
      (void)ldb, (void)beta, (void)C, (void)ldc, (void)bias;
  KILTER_FAIL("bf16 GEMMs need oneDNN; this kilter was built with " << gemm_engine()
                                                                    << " (install libdnnl-dev and rebuild)");
#endif
}

namespace {
inline bf16 round_one(uint32_t u) {
  const uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  return static_cast<bf16>(nan ? (u >> 16) | 0x40u : rounded >> 16);
}

KILTER_SIMD_CLONES
void round_to_bf16_portable(bf16* out, const float* in, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, in + i, sizeof u);
    out[i] = round_one(u);
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// The same bits, 16 lanes at a time (AVX-512F/BW: the 32 -> 16 bit narrowing is one instruction,
// which AVX2 lacks; the compiler's AVX2 loop ran at about a third of this). Not the AVX512_BF16
// conversion instruction: that one flushes denormals to zero, and the result must not depend on
// the ISA.
__attribute__((target("avx512f,avx512bw"))) void round_to_bf16_avx512(bf16* out, const float* in, size_t n) {
  const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  const __m512i quiet = _mm512_set1_epi32(0x40);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i u = _mm512_loadu_si512(in + i);
    const __m512i high = _mm512_srli_epi32(u, 16);
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, bias), _mm512_and_si512(high, one)), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
    const __m512i r = _mm512_mask_blend_epi32(nan, rounded, _mm512_or_si512(high, quiet));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm512_cvtepi32_epi16(r));
  }
  round_to_bf16_portable(out + i, in + i, n - i);
}

void round_to_bf16(bf16* out, const float* in, size_t n) {
  static const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  if (avx512)
    round_to_bf16_avx512(out, in, n);
  else
    round_to_bf16_portable(out, in, n);
}
#else
void round_to_bf16(bf16* out, const float* in, size_t n) { round_to_bf16_portable(out, in, n); }
#endif
}  // namespace

namespace {
// Runs a conversion, its time added to the profile's convert_seconds when profiling is on.
template <typename Convert>
void profiled_convert(Convert&& convert) {
  if (!profile_on) {
    convert();
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  convert();
  profile.convert_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
}  // namespace

void to_bf16(bf16* out, const float* in, size_t n) {
  profiled_convert([&] { round_to_bf16(out, in, n); });
}

void to_bf16_rows(bf16* out, size_t ld_out, const float* in, size_t ld_in, int rows, int cols) {
  profiled_convert([&] {
    for (int r = 0; r < rows; ++r) round_to_bf16(out + r * ld_out, in + r * ld_in, static_cast<size_t>(cols));
  });
}

bool gemm_has_bf16() {
#ifdef KILTER_WITH_ONEDNN
  const unsigned isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  const unsigned bf16_isa = static_cast<unsigned>(dnnl_cpu_isa_avx512_core_bf16);
  return (isa & bf16_isa) == bf16_isa;
#else
  return false;
#endif
}

std::string gemm_engine() {
#ifdef KILTER_WITH_ONEDNN
  const dnnl_version_t* v = dnnl_version();
  std::string isa;
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_avx512_core_amx: isa = "avx512_core_amx"; break;
    case dnnl_cpu_isa_avx512_core_bf16: isa = "avx512_core_bf16"; break;
    case dnnl_cpu_isa_avx512_core_vnni: isa = "avx512_core_vnni"; break;
    case dnnl_cpu_isa_avx512_core: isa = "avx512_core"; break;
    case dnnl_cpu_isa_avx2_vnni: isa = "avx2_vnni"; break;
    case dnnl_cpu_isa_avx2: isa = "avx2"; break;
    default: isa = "isa " + std::to_string(static_cast<int>(dnnl_get_effective_cpu_isa())); break;
  }
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) + " " +
         isa;
#else
  return "OpenBLAS";
#endif
}

void set_gemm_threads(int threads) {
  KILTER_CHECK(threads >= 1, "train.threads must be >= 1, got " << threads);
#ifdef KILTER_WITH_ONEDNN
  omp_set_num_threads(threads);
#else
  openblas_set_num_threads(threads);
#endif
}

int gemm_threads() {
#ifdef KILTER_WITH_ONEDNN
  return omp_get_max_threads();
#else
  return openblas_get_num_threads();
#endif
}

void gemm_profile_enable(bool on) { profile_on = on; }

GemmProfile gemm_profile_take() {
  const GemmProfile taken = profile;
  profile = GemmProfile{};
  return taken;
}

}  // namespace kilter::model
