// The abort-hook registry (abort_hooks.h).
#include "lib/comm/abort_hooks.h"

#include <map>
#include <mutex>
#include <utility>

namespace kilter::comm {

namespace {
std::mutex& registry_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::map<uint64_t, std::function<void()>>& registry() {
  static std::map<uint64_t, std::function<void()>> hooks;
  return hooks;
}
uint64_t next_token = 1;
}  // namespace

uint64_t register_abort_hook(std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  const uint64_t token = next_token++;
  registry().emplace(token, std::move(hook));
  return token;
}

void unregister_abort_hook(uint64_t token) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry().erase(token);
}

int run_abort_hooks() {
  // Under the lock: an owner unregistering (its destructor) waits until its hook has run, so no
  // hook runs on a freed object.
  std::lock_guard<std::mutex> lock(registry_mutex());
  int ran = 0;
  for (auto& [token, hook] : registry()) hook(), ++ran;
  registry().clear();  // each runs once
  return ran;
}

}  // namespace kilter::comm
