// Placeholder while the subcommand is being written (replaced by its owner).
#include <cstdio>
#include "app/commands.h"
namespace kilter::app {
int cmd_train(int, char**) { std::fprintf(stderr, "kilter: train is not built yet\n"); return 3; }
}  // namespace kilter::app
