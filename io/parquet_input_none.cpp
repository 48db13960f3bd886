// io/parquet_input.h in a build without Apache Arrow's Parquet library: what to install.
#include "io/parquet_input.h"

#include "io/base/error.h"

namespace kilter::io {

namespace {
constexpr const char* kInstall =
    "this kilter was built without Parquet and Arrow input. Install Apache Arrow's C++ Parquet library and rebuild: "
    "scripts/install-deps.sh puts PyPI's pyarrow (which ships it) into /opt/kilter/pyarrow-venv, and cmake finds it "
    "there (ENABLE_PARQUET=AUTO); or load Spack's arrow+parquet / conda-forge's libparquet and point "
    "CMAKE_PREFIX_PATH at it. Meanwhile, convert the files to JSONL and use --format jsonl";
}

bool parquet_available() { return false; }
std::string parquet_library() { return std::string("not built (") + "scripts/install-deps.sh installs pyarrow)"; }

void read_parquet_documents(const std::string& path, const ParquetReadOptions&,
                            const std::function<void(const char*, size_t)>&, const std::function<void(uint64_t)>&,
                            ParquetCounts&) {
  KILTER_USER_FAIL("input " << path << ": " << kInstall);
}

void read_arrow_ipc_documents(const std::string& path, const ParquetReadOptions&,
                              const std::function<void(const char*, size_t)>&, const std::function<void(uint64_t)>&,
                              ParquetCounts&) {
  KILTER_USER_FAIL("input " << path << ": " << kInstall);
}

}  // namespace kilter::io
