// cublaslt_loader.h: the table of cuBLASLt functions, filled from a dlopen on first use.
#include "io/base/cublaslt_loader.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

#include "io/base/error.h"

#define KILTER_STRINGIFY_(x) #x
#define KILTER_STRINGIFY(x) KILTER_STRINGIFY_(x)

namespace kilter::backend {
namespace {

// The soname this kilter was compiled against (cublas_api.h), e.g. libcublasLt.so.13.
constexpr const char* kSoname = "libcublasLt.so." KILTER_STRINGIFY(CUBLAS_VER_MAJOR);

void* open_library(std::string* tried) {
  // The soname first: LD_LIBRARY_PATH (a `module load cuda`), the executable's RUNPATH, ld.so.conf.
  if (void* handle = dlopen(kSoname, RTLD_NOW | RTLD_LOCAL)) return handle;
  *tried = std::string(kSoname) + " (" + dlerror() + ")";
#ifdef KILTER_CUDA_LIBRARY_DIR
  // Then the toolkit kilter was built with.
  const std::string built = std::string(KILTER_CUDA_LIBRARY_DIR) + "/" + kSoname;
  if (void* handle = dlopen(built.c_str(), RTLD_NOW | RTLD_LOCAL)) return handle;
  *tried += ", " + built + " (" + dlerror() + ")";
#endif
  return nullptr;
}

template <typename Fn>
void resolve(void* handle, Fn* slot, const char* name) {
  void* symbol = dlsym(handle, name);
  KILTER_CHECK(symbol != nullptr, "train.backend=cuda: " << kSoname << " has no " << name
                                                         << ": it is older than the CUDA toolkit kilter was built with ("
                                                         << CUBLAS_VER_MAJOR << "." << CUBLAS_VER_MINOR
                                                         << "); load the matching CUDA module");
  *slot = reinterpret_cast<Fn>(symbol);
}

CublasLt load() {
  std::string tried;
  void* handle = open_library(&tried);
  KILTER_CHECK(handle != nullptr, "train.backend=cuda: cannot open cuBLASLt, tried " << tried
                                      << "; load the CUDA module kilter was built with (e.g. module load cuda) or add "
                                         "its lib folder to LD_LIBRARY_PATH");
  // Kept open for the life of the process, like a linked library.
  CublasLt lt{};
  resolve(handle, &lt.Create, "cublasLtCreate");
  resolve(handle, &lt.Destroy, "cublasLtDestroy");
  resolve(handle, &lt.Matmul, "cublasLtMatmul");
  resolve(handle, &lt.MatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic");
  resolve(handle, &lt.MatmulDescCreate, "cublasLtMatmulDescCreate");
  resolve(handle, &lt.MatmulDescDestroy, "cublasLtMatmulDescDestroy");
  resolve(handle, &lt.MatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute");
  resolve(handle, &lt.MatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate");
  resolve(handle, &lt.MatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy");
  resolve(handle, &lt.MatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute");
  resolve(handle, &lt.MatrixLayoutCreate, "cublasLtMatrixLayoutCreate");
  resolve(handle, &lt.MatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy");
  resolve(handle, &lt.MatrixLayoutSetAttribute, "cublasLtMatrixLayoutSetAttribute");
  return lt;
}

}  // namespace

const CublasLt& cublaslt() {
  // A failed load throws out of call_once and the next call tries again.
  static std::once_flag once;
  static CublasLt table{};
  std::call_once(once, [] { table = load(); });
  return table;
}

}  // namespace kilter::backend
