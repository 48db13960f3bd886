// Text primitives the tokenizer.json reader builds on: UTF-8 decoding, PCRE2 regexes (UTF and
// Unicode-property mode, JIT, invalid UTF-8 never matches) and ICU's Unicode normalizers and
// per-character lowercasing, behind plain std::string interfaces.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace kilter::io {

// Decodes UTF-8 into code points; false on malformed input.
bool utf8_to_codepoints(std::string_view s, std::vector<uint32_t>& out);
// The length of the UTF-8 sequence that starts with `lead` (1 for a stray byte).
size_t utf8_char_length(unsigned char lead);

enum class UnicodeForm { nfc, nfd, nfkc, nfkd };
// `text` in the normal form (an invalid UTF-8 sequence becomes U+FFFD).
std::string unicode_normalize(UnicodeForm form, std::string_view text);
// Every character lowercased on its own, as Rust's char::to_lowercase (no context rules).
std::string unicode_lowercase(std::string_view text);
// Replaces every occurrence of `from` (non-empty) in `s` by `to`, left to right.
void replace_all(std::string& s, const std::string& from, const std::string& to);

// A compiled PCRE2 pattern; match data and a JIT stack per thread, so one Regex serves many.
class Regex {
 public:
  // Throws naming `where` and the PCRE2 message when the pattern does not compile.
  Regex(const std::string& pattern, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls found(start, end) for every non-overlapping non-empty match in `text`, in order.
  // `found` may itself run other regexes.
  template <typename Found>
  void for_each_match(std::string_view text, Found&& found) const {
    using Callback = std::remove_reference_t<Found>;
    match_all(text, [](void* context, size_t start, size_t end) {
      (*static_cast<Callback*>(context))(start, end);
    }, &found);
  }

 private:
  void match_all(std::string_view text, void (*found)(void*, size_t, size_t), void* context) const;
  void* code_ = nullptr;  // pcre2_code*
  bool jit_ = false;
};

}  // namespace kilter::io
