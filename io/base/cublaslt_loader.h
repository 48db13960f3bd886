// cuBLASLt, opened when the first GEMM engine is made rather than when kilter starts. Linking
// libcublasLt makes every process map and relocate it at start-up: ~150 MiB of resident memory
// on every rank, the CPU backend's ranks included, which never call it. kilter therefore does
// not link it: the CUDA backend reaches the functions it uses through this table, and
// cublaslt() dlopens the library (the toolkit's soname, then the toolkit's folder at build time)
// the first time it is asked for.
#pragma once
#include <cublasLt.h>

namespace kilter::backend {

struct CublasLt {
  decltype(&::cublasLtCreate) Create;
  decltype(&::cublasLtDestroy) Destroy;
  decltype(&::cublasLtMatmul) Matmul;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
  decltype(&::cublasLtMatmulDescCreate) MatmulDescCreate;
  decltype(&::cublasLtMatmulDescDestroy) MatmulDescDestroy;
  decltype(&::cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute;
  decltype(&::cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate;
  decltype(&::cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
  decltype(&::cublasLtMatrixLayoutCreate) MatrixLayoutCreate;
  decltype(&::cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy;
  decltype(&::cublasLtMatrixLayoutSetAttribute) MatrixLayoutSetAttribute;
};

// The table, loaded once (thread-safe). Throws kilter::Error naming the library and what to do
// when it cannot be opened or lacks one of the functions.
const CublasLt& cublaslt();

}  // namespace kilter::backend
