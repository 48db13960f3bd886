// `kilter --version`: version and the backends compiled into this binary.
#include <cstdio>

#include "app/commands.h"
#include "kilter/build_info.h"

namespace kilter::app {
int cmd_version(int, char**) {
  std::printf("kilter %s\nbackends: %s\n", KILTER_VERSION, KILTER_BACKENDS);
  return 0;
}
}  // namespace kilter::app
