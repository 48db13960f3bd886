// Text primitives for tokenizers (see tokenizer_text.h): PCRE2 and ICU behind std::string.
#include "io/tokenizer/tokenizer_text.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include "io/base/error.h"

namespace kilter::io {

bool utf8_to_codepoints(std::string_view s, std::vector<uint32_t>& out) {
  out.clear();
  for (size_t i = 0; i < s.size();) {
    unsigned char c = s[i];
    uint32_t cp;
    int n;
    if (c < 0x80) { cp = c; n = 1; }
    else if ((c >> 5) == 6) { cp = c & 0x1F; n = 2; }
    else if ((c >> 4) == 14) { cp = c & 0x0F; n = 3; }
    else if ((c >> 3) == 30) { cp = c & 0x07; n = 4; }
    else return false;
    if (i + n > s.size()) return false;
    for (int k = 1; k < n; ++k) {
      unsigned char d = s[i + k];
      if ((d >> 6) != 2) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    out.push_back(cp);
    i += n;
  }
  return true;
}

size_t utf8_char_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead >> 5) == 6) return 2;
  if ((lead >> 4) == 14) return 3;
  if ((lead >> 3) == 30) return 4;
  return 1;
}

std::string unicode_normalize(UnicodeForm form, std::string_view text) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* normalizer = nullptr;
  switch (form) {
    case UnicodeForm::nfc: normalizer = icu::Normalizer2::getNFCInstance(status); break;
    case UnicodeForm::nfd: normalizer = icu::Normalizer2::getNFDInstance(status); break;
    case UnicodeForm::nfkc: normalizer = icu::Normalizer2::getNFKCInstance(status); break;
    case UnicodeForm::nfkd: normalizer = icu::Normalizer2::getNFKDInstance(status); break;
  }
  KILTER_CHECK(U_SUCCESS(status), "ICU has no such normalizer (" << u_errorName(status) << ")");
  icu::UnicodeString normalized = normalizer->normalize(
      icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), int32_t(text.size()))), status);
  KILTER_CHECK(U_SUCCESS(status), "Unicode normalization failed (" << u_errorName(status) << ")");
  std::string out;
  normalized.toUTF8String(out);
  return out;
}

std::string unicode_lowercase(std::string_view text) {
  icu::UnicodeString in = icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), int32_t(text.size())));
  icu::UnicodeString out;
  for (int32_t i = 0; i < in.length();) {
    UChar32 c = in.char32At(i);
    icu::UnicodeString one(c);
    out += one.toLower(icu::Locale::getRoot());
    i += U16_LENGTH(c);
  }
  std::string result;
  out.toUTF8String(result);
  return result;
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  std::string out;
  size_t at = 0;
  for (size_t hit; (hit = s.find(from, at)) != std::string::npos; at = hit + from.size())
    out.append(s, at, hit - at).append(to);
  out.append(s, at, std::string::npos);
  s = std::move(out);
}

Regex::Regex(const std::string& pattern, const std::string& where) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset,
                                   nullptr);
  if (!code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof message);
    KILTER_FAIL(where << ": pre-tokenizer regex /" << pattern << "/ does not compile in PCRE2 at "
                      << "offset " << offset << " (" << reinterpret_cast<char*>(message) << ")");
  }
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  code_ = code;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void Regex::match_all(std::string_view text, void (*found)(void*, size_t, size_t),
                      void* context) const {
  struct Scratch {
    pcre2_match_data* data = pcre2_match_data_create(16, nullptr);
    pcre2_match_context* match_context = pcre2_match_context_create(nullptr);
    pcre2_jit_stack* stack = pcre2_jit_stack_create(32 << 10, 8 << 20, nullptr);
    Scratch() { pcre2_jit_stack_assign(match_context, nullptr, stack); }
    ~Scratch() {
      pcre2_match_data_free(data);
      pcre2_match_context_free(match_context);
      pcre2_jit_stack_free(stack);
    }
  };
  // One per thread, shared by every Regex: a nested match (found() running another regex)
  // reuses it, which is safe because each match's bounds are read before found() runs.
  thread_local Scratch scratch;
  auto* code = static_cast<pcre2_code*>(code_);
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t at = 0;
  while (at < text.size()) {
    int rc = jit_ ? pcre2_jit_match(code, subject, text.size(), at, 0, scratch.data, scratch.match_context)
                  : pcre2_match(code, subject, text.size(), at, 0, scratch.data, scratch.match_context);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    KILTER_CHECK(rc >= 0, "pre-tokenizer regex failed with PCRE2 error " << rc);
    PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(scratch.data);
    const size_t start = ovector[0], end = ovector[1];
    if (end == start) {  // an empty match yields no piece; move on by one character
      at = start + utf8_char_length((unsigned char)text[start]);
      continue;
    }
    found(context, start, end);
    at = end;
  }
}

}  // namespace kilter::io
