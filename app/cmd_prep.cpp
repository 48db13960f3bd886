// Placeholder while the subcommand is being written (replaced by its owner).
#include <cstdio>
#include "app/commands.h"
namespace kilter::app {
int cmd_prep(int, char**) { std::fprintf(stderr, "kilter: prep is not built yet\n"); return 3; }
}  // namespace kilter::app
