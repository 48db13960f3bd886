// Fuzz harness (issue 17): raw bytes as an INI config (lib/core/config.cpp: Boost.Program_options'
// INI parser with every key of the run configuration, then validate(); and ini_entries(), the
// plain reader of a run directory's config.ini). A config that parses and validates must survive
// its own round trip: config_from_ini_text(to_ini()) gives the same INI text.
#include "fuzz_common.h"
#include "lib/core/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  (void)kilter::ini_entries(text);
  kilter::Config cfg;
  try {
    cfg = kilter::config_from_ini_text(text);
    cfg.validate();
  } catch (const kilter::Error&) {
    return 0;  // refused cleanly
  }
  const std::string ini = cfg.to_ini();
  kilter::Config again;
  try {
    again = kilter::config_from_ini_text(ini);
    again.validate();
  } catch (const kilter::Error& e) {
    kilter::fuzz::finding(std::string("the resolved INI of a valid config is refused: ") + e.what());
  }
  // Equal INI texts mean equal values of every key, hence equal hashes (Config::hash()).
  KILTER_FUZZ_EXPECT(again.to_ini() == ini, "the INI text changes over a round trip");
  return 0;
}
