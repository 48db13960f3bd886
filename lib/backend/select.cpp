// The one place that picks a model backend (model.h): "cpu" is always compiled in; "cuda" only
// with KILTER_WITH_CUDA, through lib/backend/cuda_model.h.
#include <memory>
#include <string>
#include <vector>

#include "io/base/error.h"
#include "lib/backend/cpu_model.h"
#include "lib/model/model.h"
#ifdef KILTER_WITH_CUDA
#include "lib/backend/cuda_model.h"
#endif

namespace kilter::model {

std::unique_ptr<Model> make_model(const std::string& backend, const ModelSpec& cfg, size_t pad_multiple,
                                  const BackendOptions& options) {
  if (backend == "cpu") {
    KILTER_CHECK(options.attention == "auto", "train.attention=" << options.attention
                                                                << " needs train.backend=cuda (the cpu backend has one "
                                                                   "attention; use auto)");
    KILTER_CHECK(!options.cuda_graphs, "train.cuda_graphs=true needs train.backend=cuda");
    // The constructor checks the precision and the recompute mode.
    KILTER_USER_CHECK(options.bf16_storage == "auto" || options.bf16_storage == "on" || options.bf16_storage == "off",
                      "train.bf16_storage=" << options.bf16_storage << " is not one of auto, on, off");
    return std::make_unique<backend::CpuModel>(cfg, pad_multiple, options.precision, options.recompute,
                                               options.bf16_storage == "on");
  }
  if (backend == "cuda") {
#ifdef KILTER_WITH_CUDA
    return backend::make_cuda_model(cfg, pad_multiple, options);
#else
    KILTER_FAIL("train.backend=cuda: this kilter was built without CUDA (rebuild with -DENABLE_CUDA=ON)");
#endif
  }
  KILTER_FAIL("train.backend: unknown model backend '" << backend << "' (expected cpu or cuda)");
}

std::unique_ptr<Model> make_model(const std::string& backend, const ModelSpec& cfg, size_t pad_multiple,
                                  const std::string& precision) {
  BackendOptions options;
  options.precision = precision;
  return make_model(backend, cfg, pad_multiple, options);
}

std::string datapath_self_check(const std::string& backend, const ModelSpec& cfg, const BackendOptions& options) {
  if (backend != "cuda" || options.precision != "bf16" || options.bf16_storage != "auto" ||
      options.attention == "cudnn")
    return "";
#ifdef KILTER_WITH_CUDA
  return backend::cuda_bf16_storage_self_check(cfg, options);
#else
  (void)cfg;
  return "";
#endif
}

bool cuda_available() {
#ifdef KILTER_WITH_CUDA
  return backend::cuda_device_present();
#else
  return false;
#endif
}

bool cuda_device_memory(uint64_t* free_bytes, uint64_t* total_bytes) {
#ifdef KILTER_WITH_CUDA
  return backend::cuda_device_memory(free_bytes, total_bytes);
#else
  (void)free_bytes, (void)total_bytes;
  return false;
#endif
}

}  // namespace kilter::model
