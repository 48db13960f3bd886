// `kilter --version`: version, the backends compiled into this binary, and its Parquet reader.
#include <cstdio>

#include "app/commands.h"
#include "io/parquet_input.h"
#include "kilter/build_info.h"

namespace kilter::app {
int cmd_version(int, char**) {
  std::printf("kilter %s\nbackends: %s\n", KILTER_VERSION, KILTER_BACKENDS);
  std::printf("parquet: %s\n", io::parquet_library().c_str());
  return 0;
}
}  // namespace kilter::app
