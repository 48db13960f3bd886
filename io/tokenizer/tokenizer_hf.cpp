// The "hf-bpe" tokenizer: a Hugging Face tokenizer.json with a byte-level BPE model (GPT-2,
// RoBERTa, Llama-3, and what `tokenizers.ByteLevelBPETokenizer` trains), encoding as the
// `tokenizers` library does with add_special_tokens=False:
//   1. added tokens are split out of the raw text (leftmost-longest; lstrip/rstrip honoured;
//      tokens with normalized = true out of the normalized text);
//   2. the normalizer runs on the text between them (NFC/NFD/NFKC/NFKD, Lowercase, Prepend,
//      Replace with a string pattern, Sequence; ICU does the Unicode work);
//   3. the pre-tokenizer splits it (Split with a regex or string, ByteLevel with its GPT-2
//      regex and add_prefix_space, Digits, Sequence; regexes run in PCRE2, UTF + UCP, JIT);
//   4. each word's bytes are merged by rank (lowest rank, leftmost first), cached per thread.
// The ByteLevel byte-to-unicode map is a bijection, so vocabulary strings are mapped back to
// bytes once at load and words are merged as raw bytes. Components outside this list are refused
// by name. Post-processors (BOS templates) are not applied: kilter ends documents with EOS itself.
#include <algorithm>
#include <atomic>
#include <memory>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "io/base/error.h"
#include "io/tokenizer/tokenizer.h"
#include "io/tokenizer/tokenizer_text.h"

namespace kilter::io {

namespace {

using json = nlohmann::json;

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes map to themselves, the rest to U+0100...
std::vector<uint32_t> byte_to_codepoint() {
  std::vector<uint32_t> map(256, 0);
  std::vector<bool> direct(256, false);
  for (int b = '!'; b <= '~'; ++b) direct[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) map[b] = direct[b] ? uint32_t(b) : next++;
  return map;
}

// ---- normalizers --------------------------------------------------------------------------

struct NormalizerStep {
  enum class Kind { unicode, lowercase, prepend, replace } kind;
  UnicodeForm form = UnicodeForm::nfc;  // unicode
  std::string text, replacement;        // prepend: text; replace: text -> replacement
};

// ---- pre-tokenizers -----------------------------------------------------------------------

struct PreTokenizerStep {
  enum class Kind { split, byte_level, digits } kind;
  std::shared_ptr<Regex> regex;  // split, byte_level with use_regex
  enum class Behavior { isolated, removed } behavior = Behavior::isolated;
  bool invert = false;
  bool add_prefix_space = false;
  bool individual_digits = false;
};

// GPT-2's pattern, which ByteLevel uses when use_regex is true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct AddedToken {
  std::string content;
  uint32_t id = 0;
  bool special = false;
  bool lstrip = false, rstrip = false;
};

// Added tokens matched together: leftmost, then longest.
struct AddedSet {
  std::vector<AddedToken> tokens;
  bool first_byte[256] = {};

  void finish() {
    std::sort(tokens.begin(), tokens.end(), [](const AddedToken& a, const AddedToken& b) {
      return a.content.size() > b.content.size();
    });
    for (const AddedToken& token : tokens) first_byte[(unsigned char)token.content[0]] = true;
  }
  // The leftmost (then longest) token in text[from..); fills [start, end) including the
  // whitespace that lstrip/rstrip take in.
  const AddedToken* find(std::string_view text, size_t from, size_t& start, size_t& end) const;
};

bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

const AddedToken* AddedSet::find(std::string_view text, size_t from, size_t& start, size_t& end) const {
  if (tokens.empty()) return nullptr;
  for (size_t i = from; i < text.size(); ++i) {
    if (!first_byte[(unsigned char)text[i]]) continue;
    for (const AddedToken& token : tokens) {
      if (text.compare(i, token.content.size(), token.content) != 0) continue;
      start = i;
      end = i + token.content.size();
      if (token.lstrip)
        while (start > from && is_space((unsigned char)text[start - 1])) --start;
      if (token.rstrip)
        while (end < text.size() && is_space((unsigned char)text[end])) ++end;
      return &token;
    }
  }
  return nullptr;
}

class HfBpeTokenizer final : public Tokenizer {
 public:
  HfBpeTokenizer(const std::string& bytes, const std::string& where) : bytes_(bytes), where_(where) {
    static std::atomic<uint64_t> serials{0};
    serial_ = ++serials;
    json root;
    try {
      root = json::parse(bytes);
    } catch (const json::exception& e) {
      KILTER_FAIL(where << ": not valid JSON (" << e.what() << ")");
    }
    KILTER_CHECK(root.is_object(), where << ": a tokenizer.json must be a JSON object");
    try {
      // Ids are numbered densely: none reaches the number of tokens the file defines (a huge id
      // would size the id tables, and the model's vocabulary, by it).
      const json& model = root.value("model", json());
      if (model.is_object() && model.contains("vocab") && model["vocab"].is_object())
        id_limit_ += model["vocab"].size();
      if (root.contains("added_tokens") && root["added_tokens"].is_array())
        id_limit_ += root["added_tokens"].size();
      load_model(root.value("model", json()));
      load_normalizer(root.value("normalizer", json()), "normalizer");
      load_added_tokens(root.value("added_tokens", json::array()));
      load_pre_tokenizer(root.value("pre_tokenizer", json()), "pre_tokenizer");
      load_decoder(root.value("decoder", json()));
    } catch (const json::exception& e) {
      KILTER_FAIL(where << ": unexpected tokenizer.json structure (" << e.what() << ")");
    }
    KILTER_CHECK(byte_level_, where << ": pre_tokenizer has no ByteLevel step; only byte-level BPE "
                                    << "tokenizer.json files are supported (use a SentencePiece "
                                    << "*.model for other vocabularies)");
    choose_eos();
    choose_bos(root.value("post_processor", json()));
  }

  std::string kind() const override { return "hf-bpe"; }
  uint32_t vocab_size() const override { return vocab_size_; }
  uint32_t eos_id() const override { return eos_; }
  int64_t bos_id() const override { return bos_; }
  const std::string& file_bytes() const override { return bytes_; }

  // As `tokenizers`: tokens with normalized = false are split out of the raw text, the text
  // between them is normalized, then tokens with normalized = true are split out of that.
  void encode(std::string_view text, std::vector<uint32_t>& out) const override {
    split_added(raw_added_, text, out, [&](std::string_view segment) {
      const std::string normalized = normalize(segment);
      split_added(normalized_added_, normalized, out,
                  [&](std::string_view piece) { encode_normalized(piece, out); });
    });
  }

  std::string decode(const uint32_t* ids, size_t count) const override {
    std::string text;
    for (size_t i = 0; i < count; ++i) {
      uint32_t id = ids[i];
      if (id == eos_ || id >= id_text_.size()) continue;
      text += id_text_[id];
    }
    return text;
  }

 private:
  // -- loading --

  void load_model(const json& model) {
    KILTER_CHECK(model.is_object(), where_ << ": model is missing");
    std::string type = model.value("type", std::string("BPE"));
    KILTER_CHECK(type == "BPE", where_ << ": model.type = " << type << " is not supported (only "
                                       << "byte-level BPE; use a SentencePiece *.model instead)");
    if (model.contains("dropout") && !model["dropout"].is_null())
      KILTER_CHECK(model["dropout"].get<double>() == 0.0,
                   where_ << ": model.dropout is set; dropout makes tokenization random and is "
                             "not supported (set it to null)");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (model.contains(key) && !model[key].is_null())
        KILTER_CHECK(model[key].get<std::string>().empty(),
                     where_ << ": model." << key << " is not supported by byte-level BPE");
    KILTER_CHECK(!model.value("byte_fallback", false),
                 where_ << ": model.byte_fallback = true is not supported (byte-level BPE needs none)");
    ignore_merges_ = model.value("ignore_merges", false);
    fuse_unk_ = model.value("fuse_unk", false);

    const std::vector<uint32_t> to_codepoint = byte_to_codepoint();
    std::unordered_map<uint32_t, unsigned char> to_byte;
    for (int b = 0; b < 256; ++b) to_byte[to_codepoint[b]] = (unsigned char)b;

    const json& vocab = model.at("vocab");
    KILTER_CHECK(vocab.is_object(), where_ << ": model.vocab must be an object");
    std::vector<uint32_t> cps;
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      const uint32_t id = id_of(it.value(), "model.vocab entry");
      vocab_size_ = std::max(vocab_size_, id + 1);
      if (id >= id_text_.size()) id_text_.resize(id + 1);
      // The token's bytes: every character through the inverse byte map (a token with other
      // characters cannot come out of byte-level merges; it decodes as its own UTF-8).
      std::string bytes;
      bool mapped = utf8_to_codepoints(it.key(), cps);
      for (uint32_t cp : cps) {
        auto b = to_byte.find(cp);
        if (b == to_byte.end()) { mapped = false; break; }
        bytes.push_back(char(b->second));
      }
      id_text_[id] = mapped ? bytes : it.key();
      if (mapped) word_ids_.emplace(bytes, id);
      token_ids_.emplace(it.key(), id);
    }
    for (int b = 0; b < 256; ++b) {
      auto it = word_ids_.find(std::string(1, char(b)));
      byte_id_[b] = it == word_ids_.end() ? kNone : it->second;
    }
    if (model.contains("unk_token") && !model["unk_token"].is_null()) {
      auto it = token_ids_.find(model["unk_token"].get<std::string>());
      KILTER_CHECK(it != token_ids_.end(), where_ << ": model.unk_token is not in the vocabulary");
      unk_ = it->second;
    }

    const json& merges = model.at("merges");
    KILTER_CHECK(merges.is_array(), where_ << ": model.merges must be an array");
    merges_.reserve(merges.size() * 2);
    for (size_t rank = 0; rank < merges.size(); ++rank) {
      const json& merge = merges[rank];
      std::string left, right;
      if (merge.is_string()) {  // "a b" (tokenizers < 0.20)
        const std::string& pair = merge.get_ref<const std::string&>();
        size_t space = pair.find(' ');
        KILTER_CHECK(space != std::string::npos && pair.find(' ', space + 1) == std::string::npos,
                     where_ << ": model.merges[" << rank << "] = '" << pair << "' is not 'A B'");
        left = pair.substr(0, space);
        right = pair.substr(space + 1);
      } else {  // ["a", "b"]
        KILTER_CHECK(merge.is_array() && merge.size() == 2,
                     where_ << ": model.merges[" << rank << "] is not a pair");
        left = merge[0].get<std::string>();
        right = merge[1].get<std::string>();
      }
      auto a = token_ids_.find(left), b = token_ids_.find(right), ab = token_ids_.find(left + right);
      KILTER_CHECK(a != token_ids_.end() && b != token_ids_.end() && ab != token_ids_.end(),
                   where_ << ": model.merges[" << rank << "] ('" << left << "', '" << right
                          << "') names a token missing from model.vocab");
      merges_.emplace(pair_key(a->second, b->second), Merge{uint32_t(rank), ab->second});
    }
  }

  // A token id: a JSON integer from 0, below the number of tokens the file defines (a float or a
  // negative number is refused rather than converted: 1e113 does not fit any integer type).
  uint32_t id_of(const json& value, const char* what) const {
    KILTER_CHECK(value.is_number_unsigned() || (value.is_number_integer() && value.get<int64_t>() >= 0),
                 where_ << ": " << what << " has id " << value.dump() << ", not an integer from 0");
    const uint64_t id = value.get<uint64_t>();
    KILTER_CHECK(id < id_limit_, where_ << ": " << what << " has id " << id << ", not below the "
                                       << id_limit_ << " tokens the file defines (ids must be "
                                       << "numbered densely from 0)");
    return uint32_t(id);
  }

  void load_added_tokens(const json& tokens) {
    for (const json& entry : tokens) {
      AddedToken token;
      token.content = entry.at("content").get<std::string>();
      token.id = id_of(entry.at("id"), "added token");
      token.special = entry.value("special", false);
      token.lstrip = entry.value("lstrip", false);
      token.rstrip = entry.value("rstrip", false);
      KILTER_CHECK(!entry.value("single_word", false),
                   where_ << ": added token '" << token.content << "' has single_word = true, "
                          << "which is not supported");
      // A normalized token is matched, and decodes, in its normalized form.
      const bool normalized = entry.value("normalized", !token.special) && !normalizers_.empty();
      if (normalized) token.content = normalize(token.content);
      if (token.content.empty()) continue;
      vocab_size_ = std::max(vocab_size_, token.id + 1);
      if (token.id >= id_text_.size()) id_text_.resize(token.id + 1);
      id_text_[token.id] = token.content;
      all_added_.push_back(token);
      (normalized ? normalized_added_ : raw_added_).tokens.push_back(token);
    }
    raw_added_.finish();
    normalized_added_.finish();
  }

  void load_normalizer(const json& node, const std::string& path) {
    if (node.is_null()) return;
    std::string type = node.at("type").get<std::string>();
    NormalizerStep step;
    if (type == "Sequence") {
      const json& list = node.at("normalizers");
      for (size_t i = 0; i < list.size(); ++i)
        load_normalizer(list[i], path + ".normalizers[" + std::to_string(i) + "]");
      return;
    }
    if (type == "NFC") {
      step = {NormalizerStep::Kind::unicode, UnicodeForm::nfc};
    } else if (type == "NFD") {
      step = {NormalizerStep::Kind::unicode, UnicodeForm::nfd};
    } else if (type == "NFKC") {
      step = {NormalizerStep::Kind::unicode, UnicodeForm::nfkc};
    } else if (type == "NFKD") {
      step = {NormalizerStep::Kind::unicode, UnicodeForm::nfkd};
    } else if (type == "Lowercase") {
      step.kind = NormalizerStep::Kind::lowercase;
    } else if (type == "Prepend") {
      step.kind = NormalizerStep::Kind::prepend;
      step.text = node.at("prepend").get<std::string>();
    } else if (type == "Replace") {
      const json& pattern = node.at("pattern");
      KILTER_CHECK(pattern.contains("String"), where_ << ": " << path << ".type = Replace with a "
                                                     << "regex pattern is not supported");
      step.kind = NormalizerStep::Kind::replace;
      step.text = pattern["String"].get<std::string>();
      step.replacement = node.at("content").get<std::string>();
    } else {
      KILTER_FAIL(where_ << ": " << path << ".type = " << type << " is not supported (supported: "
                         << "NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace, Sequence)");
    }
    normalizers_.push_back(step);
  }

  void load_pre_tokenizer(const json& node, const std::string& path) {
    if (node.is_null()) return;
    std::string type = node.at("type").get<std::string>();
    PreTokenizerStep step;
    if (type == "Sequence") {
      const json& list = node.at("pretokenizers");
      for (size_t i = 0; i < list.size(); ++i)
        load_pre_tokenizer(list[i], path + ".pretokenizers[" + std::to_string(i) + "]");
      return;
    }
    if (type == "ByteLevel") {
      step.kind = PreTokenizerStep::Kind::byte_level;
      step.add_prefix_space = node.value("add_prefix_space", true);
      if (node.value("use_regex", true)) step.regex = std::make_shared<Regex>(kGpt2Pattern, where_);
      byte_level_ = true;
    } else if (type == "Split") {
      step.kind = PreTokenizerStep::Kind::split;
      const json& pattern = node.at("pattern");
      std::string regex;
      if (pattern.contains("Regex")) {
        regex = pattern["Regex"].get<std::string>();
      } else {
        // A literal string: quoted for PCRE2.
        regex = "\\Q" + pattern.at("String").get<std::string>() + "\\E";
      }
      step.regex = std::make_shared<Regex>(regex, where_);
      std::string behavior = node.value("behavior", std::string("Isolated"));
      if (behavior == "Isolated") {
        step.behavior = PreTokenizerStep::Behavior::isolated;
      } else if (behavior == "Removed") {
        step.behavior = PreTokenizerStep::Behavior::removed;
      } else {
        KILTER_FAIL(where_ << ": " << path << ".behavior = " << behavior
                           << " is not supported (supported: Isolated, Removed)");
      }
      step.invert = node.value("invert", false);
    } else if (type == "Digits") {
      step.kind = PreTokenizerStep::Kind::digits;
      step.individual_digits = node.value("individual_digits", false);
    } else {
      KILTER_FAIL(where_ << ": " << path << ".type = " << type << " is not supported (supported: "
                         << "ByteLevel, Split, Digits, Sequence)");
    }
    pre_tokenizers_.push_back(step);
  }

  void load_decoder(const json& node) {
    if (node.is_null()) return;
    std::string type = node.at("type").get<std::string>();
    KILTER_CHECK(type == "ByteLevel" || type == "Sequence",
                 where_ << ": decoder.type = " << type << " is not supported (byte-level BPE "
                        << "decodes with ByteLevel)");
  }

  void choose_eos() {
    // The rule (docs/data.md): the first of these names the tokenizer knows, else an extra id.
    for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"}) {
      for (const AddedToken& token : all_added_)
        if (token.content == name) { eos_ = token.id; return; }
      auto it = token_ids_.find(name);
      if (it != token_ids_.end()) { eos_ = it->second; return; }
    }
    eos_ = vocab_size_++;
  }

  // BOS: the special token the post-processor's template puts before a single sequence (Llama 3's
  // TemplateProcessing, also inside a Sequence), else a special added token named like one.
  void choose_bos(const json& post) {
    if (post.is_object() && post.value("type", "") == "Sequence" && post.contains("processors"))
      for (const json& step : post["processors"]) {
        choose_bos(step);
        if (bos_ >= 0) return;
      }
    if (post.is_object() && post.value("type", "") == "TemplateProcessing" && post.contains("single") &&
        post["single"].is_array() && !post["single"].empty()) {
      const json& first = post["single"][0];
      if (first.contains("SpecialToken")) {
        const std::string name = first["SpecialToken"].value("id", "");
        for (const AddedToken& token : all_added_)
          if (token.content == name) { bos_ = token.id; return; }
      }
    }
    if (!post.is_null()) return;
    for (const char* name : {"<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>"})
      for (const AddedToken& token : all_added_)
        if (token.special && token.content == name) { bos_ = token.id; return; }
  }

  // -- encoding --

  // Calls segment() for the text between the set's tokens and appends the tokens' ids.
  template <typename Segment>
  static void split_added(const AddedSet& set, std::string_view text, std::vector<uint32_t>& out,
                          Segment segment) {
    size_t at = 0;
    while (at < text.size()) {
      size_t start = 0, end = 0;
      const AddedToken* token = set.find(text, at, start, end);
      if (!token) {
        segment(text.substr(at));
        return;
      }
      if (start > at) segment(text.substr(at, start - at));
      out.push_back(token->id);
      at = end;
    }
  }

  std::string normalize(std::string_view raw) const {
    std::string normalized(raw);
    for (const NormalizerStep& step : normalizers_) {
      switch (step.kind) {
        case NormalizerStep::Kind::unicode: normalized = unicode_normalize(step.form, normalized); break;
        case NormalizerStep::Kind::lowercase: normalized = unicode_lowercase(normalized); break;
        case NormalizerStep::Kind::prepend:
          if (!normalized.empty()) normalized = step.text + normalized;
          break;
        case NormalizerStep::Kind::replace: replace_all(normalized, step.text, step.replacement); break;
      }
    }
    return normalized;
  }

  // Pre-tokenization and BPE of normalized text: each pre-tokenizer step refines the list of
  // pieces (kept as strings since ByteLevel's add_prefix_space can insert text).
  void encode_normalized(std::string_view normalized, std::vector<uint32_t>& out) const {
    pre_tokenize(0, normalized, out);
  }

  // Step `step` of the pre-tokenizer splits `piece`; each part goes through the next steps and
  // finally BPE, depth first (the order `tokenizers` gives, without materialising the parts).
  void pre_tokenize(size_t step_index, std::string_view piece, std::vector<uint32_t>& out) const {
    if (piece.empty()) return;
    if (step_index == pre_tokenizers_.size()) {
      encode_word(piece, out);
      return;
    }
    const PreTokenizerStep& step = pre_tokenizers_[step_index];
    auto next = [&](std::string_view part) { pre_tokenize(step_index + 1, part, out); };
    switch (step.kind) {
      case PreTokenizerStep::Kind::byte_level:
        if (step.add_prefix_space && piece[0] != ' ') {
          const std::string prefixed = " " + std::string(piece);
          split_byte_level(step, prefixed, next);
        } else {
          split_byte_level(step, piece, next);
        }
        return;
      case PreTokenizerStep::Kind::split:
        split_regex(*step.regex, step.behavior, step.invert, piece, next);
        return;
      case PreTokenizerStep::Kind::digits: {
        size_t at = 0;
        while (at < piece.size()) {
          bool digit = piece[at] >= '0' && piece[at] <= '9';
          size_t end = at + 1;
          if (!digit) {
            while (end < piece.size() && !(piece[end] >= '0' && piece[end] <= '9')) ++end;
          } else if (!step.individual_digits) {
            while (end < piece.size() && piece[end] >= '0' && piece[end] <= '9') ++end;
          }
          next(piece.substr(at, end - at));
          at = end;
        }
        return;
      }
    }
  }

  template <typename Next>
  static void split_byte_level(const PreTokenizerStep& step, std::string_view piece, Next& next) {
    if (step.regex) {
      split_regex(*step.regex, PreTokenizerStep::Behavior::isolated, false, piece, next);
    } else {
      next(piece);
    }
  }

  // Isolated: matches and the text between them are parts; Removed: only the text between.
  // invert swaps the roles of matches and gaps.
  template <typename Next>
  static void split_regex(const Regex& regex, PreTokenizerStep::Behavior behavior, bool invert,
                          std::string_view piece, Next& next) {
    const bool keep_matches = invert || behavior == PreTokenizerStep::Behavior::isolated;
    const bool keep_gaps = !invert || behavior == PreTokenizerStep::Behavior::isolated;
    size_t last = 0;
    regex.for_each_match(piece, [&](size_t start, size_t end) {
      if (start > last && keep_gaps) next(piece.substr(last, start - last));
      if (keep_matches) next(piece.substr(start, end - start));
      last = end;
    });
    if (last < piece.size() && keep_gaps) next(piece.substr(last));
  }

  struct Merge {
    uint32_t rank;
    uint32_t id;
  };
  static uint64_t pair_key(uint32_t a, uint32_t b) { return (uint64_t(a) << 32) | b; }
  static constexpr uint32_t kNone = UINT32_MAX;

  // One word's ids by BPE over its bytes, through a per-thread cache.
  void encode_word(std::string_view word_view, std::vector<uint32_t>& out) const {
    struct Cache {
      uint64_t owner = 0;
      std::unordered_map<std::string, std::vector<uint32_t>> words;
    };
    thread_local Cache cache;
    if (cache.owner != serial_) {
      cache.words.clear();
      cache.owner = serial_;
    }
    const std::string word(word_view);
    const bool cacheable = word.size() <= 64;
    if (cacheable) {
      auto hit = cache.words.find(word);
      if (hit != cache.words.end()) {
        out.insert(out.end(), hit->second.begin(), hit->second.end());
        return;
      }
    }
    std::vector<uint32_t> ids;
    merge_word(word, ids);
    out.insert(out.end(), ids.begin(), ids.end());
    if (cacheable) {
      if (cache.words.size() >= 200000) cache.words.clear();
      cache.words.emplace(word, std::move(ids));
    }
  }

  void merge_word(const std::string& word, std::vector<uint32_t>& symbols) const {
    if (ignore_merges_) {
      auto whole = word_ids_.find(word);
      if (whole != word_ids_.end()) {
        symbols.push_back(whole->second);
        return;
      }
    }
    symbols.clear();
    for (unsigned char c : word) {
      uint32_t id = byte_id_[c];
      if (id == kNone) {
        // As `tokenizers`: an unknown symbol becomes unk (fused when asked), else is dropped.
        if (unk_ == kNone) continue;
        if (fuse_unk_ && !symbols.empty() && symbols.back() == unk_) continue;
        id = unk_;
      }
      symbols.push_back(id);
    }
    if (symbols.size() < 2) return;
    // ranks[i]: the merge of symbols[i] and symbols[i+1] (rank, result), kNone when none.
    std::vector<Merge> ranks(symbols.size() - 1);
    auto lookup = [&](size_t i) {
      auto it = merges_.find(pair_key(symbols[i], symbols[i + 1]));
      return it == merges_.end() ? Merge{kNone, kNone} : it->second;
    };
    for (size_t i = 0; i + 1 < symbols.size(); ++i) ranks[i] = lookup(i);
    while (true) {
      size_t best = kNone;
      uint32_t best_rank = kNone;
      for (size_t i = 0; i < ranks.size(); ++i)
        if (ranks[i].rank < best_rank) {
          best_rank = ranks[i].rank;
          best = i;
        }
      if (best_rank == kNone) return;
      symbols[best] = ranks[best].id;
      symbols.erase(symbols.begin() + best + 1);
      ranks.erase(ranks.begin() + best);
      if (best < ranks.size()) ranks[best] = lookup(best);
      if (best > 0) ranks[best - 1] = lookup(best - 1);
    }
  }

  std::string bytes_;
  std::string where_;
  uint64_t serial_ = 0;
  uint32_t vocab_size_ = 0;
  uint64_t id_limit_ = 0;  // vocab entries + added tokens: ids are below it
  uint32_t eos_ = 0;
  int64_t bos_ = -1;
  uint32_t unk_ = kNone;
  bool ignore_merges_ = false;
  bool fuse_unk_ = false;
  bool byte_level_ = false;
  std::vector<std::string> id_text_;                          // decode: id -> bytes
  std::unordered_map<std::string, uint32_t> token_ids_;       // vocabulary string -> id
  std::unordered_map<std::string, uint32_t> word_ids_;        // token bytes -> id
  uint32_t byte_id_[256];
  std::unordered_map<uint64_t, Merge> merges_;                // (left, right) -> rank, result
  std::vector<AddedToken> all_added_;
  AddedSet raw_added_;         // normalized = false (or no normalizer): matched on the raw text
  AddedSet normalized_added_;  // normalized = true: matched on the normalized text
  std::vector<NormalizerStep> normalizers_;
  std::vector<PreTokenizerStep> pre_tokenizers_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_hf_bpe_tokenizer(const std::string& json_bytes,
                                                 const std::string& where) {
  return std::make_unique<HfBpeTokenizer>(json_bytes, where);
}

}  // namespace kilter::io
