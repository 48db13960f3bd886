// Placeholder while the subcommand is being written (replaced by its owner).
#include <cstdio>
#include "app/commands.h"
namespace kilter::app {
int cmd_plan(int, char**) { std::fprintf(stderr, "kilter: plan is not built yet\n"); return 3; }
}  // namespace kilter::app
