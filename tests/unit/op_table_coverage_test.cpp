// The op table's completeness, checked on any machine: every function declared in namespace
// kilter::model::cuda (the headers under lib/ that open it, lib/backend/cuda_ops.h first) has a
// row in tests/gpu/op_table_cases.cpp, or a named test that covers it; every kernel a row names is
// declared; every family has rows of its dtype. A new kernel without a row fails here, before any
// device runs. Overloads on fp32 and bf16 rows count separately ("rope_forward(bf16)").
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/gpu/op_table.h"

namespace kilter::optable {
namespace {

struct Declaration {
  std::string name;                 // "f" or "Class::f"
  std::vector<std::string> params;  // parameter types, names and defaults dropped
  std::string header;
};

std::string trim(const std::string& s) {
  const size_t first = s.find_first_not_of(" \t\n\r");
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(" \t\n\r") - first + 1);
}

std::string strip_comments(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text.compare(i, 2, "//") == 0) {
      i = text.find('\n', i);
      if (i == std::string::npos) break;
      out += '\n';
    } else if (text.compare(i, 2, "/*") == 0) {
      i = text.find("*/", i);
      if (i == std::string::npos) break;
      ++i;
    } else {
      out += text[i];
    }
  }
  return out;
}

// The parameter types of "f(int a, const float* b = nullptr)": {"int", "const float*"}.
std::vector<std::string> parameter_types(const std::string& statement) {
  const size_t open = statement.find('(');
  std::vector<std::string> types;
  std::string current;
  int depth = 0;
  bool in_default = false;
  auto finish = [&] {
    std::string param = trim(current);
    current.clear();
    in_default = false;
    if (param.empty()) return;
    size_t end = param.size();  // drop the parameter's name: its last identifier
    while (end > 0 && (std::isalnum(static_cast<unsigned char>(param[end - 1])) || param[end - 1] == '_')) --end;
    if (end > 0 && trim(param.substr(0, end)) != "const") param = trim(param.substr(0, end));
    std::string normal;
    for (char c : param)
      if (!std::isspace(static_cast<unsigned char>(c))) normal += c;
    types.push_back(normal);
  };
  for (size_t i = open + 1; i < statement.size(); ++i) {
    const char c = statement[i];
    if (c == '(' || c == '<') ++depth;
    if ((c == ')' || c == '>') && depth > 0) {
      --depth;
      if (!in_default) current += c;
      continue;
    }
    if (c == ')' && depth == 0) break;
    if (c == ',' && depth == 0) {
      finish();
      continue;
    }
    if (c == '=' && depth == 0) in_default = true;
    if (!in_default) current += c;
  }
  finish();
  return types;
}

// The identifier just before the statement's first '(' ("" when there is none).
std::string function_name(const std::string& statement) {
  const size_t open = statement.find('(');
  if (open == std::string::npos) return "";
  size_t end = open;
  while (end > 0 && std::isspace(static_cast<unsigned char>(statement[end - 1]))) --end;
  size_t begin = end;
  while (begin > 0 && (std::isalnum(static_cast<unsigned char>(statement[begin - 1])) || statement[begin - 1] == '_' ||
                       statement[begin - 1] == '~'))
    --begin;
  return statement.substr(begin, end - begin);
}

bool starts_with_word(const std::string& s, const std::string& word) {
  return s.compare(0, word.size(), word) == 0 && (s.size() == word.size() || !std::isalnum(s[word.size()]));
}

// The public functions (free and members) declared or defined in each `namespace
// kilter::model::cuda {` block of a header. Constructors, destructors, operators and private
// members are left out; enum, struct and function bodies are skipped.
std::vector<Declaration> parse_declarations(const std::string& raw, const std::string& header) {
  const std::string text = strip_comments(raw);
  const std::string opening = "namespace kilter::model::cuda {";
  std::vector<Declaration> out;
  for (size_t at = text.find(opening); at != std::string::npos; at = text.find(opening, at + 1)) {
    struct Scope {
      char kind;  // 'c' class/struct body, 's' skipped body (function, enum, other)
      std::string name;
      bool is_public;
    };
    std::vector<Scope> scopes;
    std::string statement;
    for (size_t i = at + opening.size(); i < text.size(); ++i) {
      const char c = text[i];
      if (c != '{' && c != '}' && c != ';') {
        statement += c;
        continue;
      }
      std::string s = trim(statement);
      statement.clear();
      const bool in_class = !scopes.empty() && scopes.back().kind == 'c';
      const bool skipping = !scopes.empty() && scopes.back().kind == 's';
      for (const char* access : {"public:", "private:", "protected:"}) {
        if (in_class && s.compare(0, std::string(access).size(), access) == 0) {
          scopes.back().is_public = std::string(access) == "public:";
          s = trim(s.substr(std::string(access).size()));
        }
      }
      if (c == '}') {
        if (scopes.empty()) break;  // the namespace's end
        scopes.pop_back();
        continue;
      }
      std::string name = skipping ? "" : function_name(s);
      const bool declares = !name.empty() && !starts_with_word(s, "using") && !starts_with_word(s, "typedef") &&
                            !starts_with_word(s, "static_assert") && s.find("operator") == std::string::npos &&
                            name[0] != '~' && !(in_class && name == scopes.back().name) &&
                            (!in_class || scopes.back().is_public);
      if (declares) out.push_back({in_class ? scopes.back().name + "::" + name : name, parameter_types(s), header});
      if (c == '{') {
        const bool is_class = (starts_with_word(s, "class") || starts_with_word(s, "struct")) &&
                              s.find('(') == std::string::npos;
        if (is_class) {
          std::istringstream words(s);
          std::string keyword, class_name;
          words >> keyword >> class_name;
          scopes.push_back({'c', class_name, keyword == "struct"});
        } else {
          scopes.push_back({'s', "", false});
        }
      }
    }
  }
  return out;
}

// Keys of the declarations: the name, and for a name declared more than once "(bf16)" or "(fp32)"
// after the first parameter type in which its overloads differ.
std::map<std::string, std::string> declaration_keys(const std::vector<Declaration>& declarations) {
  std::map<std::string, std::vector<const Declaration*>> by_name;
  for (const Declaration& d : declarations) by_name[d.name].push_back(&d);
  std::map<std::string, std::string> keys;  // key -> header
  for (const auto& [name, overloads] : by_name) {
    if (overloads.size() == 1) {
      keys[name] = overloads[0]->header;
      continue;
    }
    for (const Declaration* d : overloads) {
      std::string tag = "fp32";
      for (size_t p = 0; p < d->params.size(); ++p) {
        const bool differs = std::any_of(overloads.begin(), overloads.end(), [&](const Declaration* other) {
          return p >= other->params.size() || other->params[p] != d->params[p];
        });
        if (differs) {
          tag = d->params[p].find("bf16") != std::string::npos ? "bf16" : "fp32";
          break;
        }
      }
      keys[name + "(" + tag + ")"] = d->header;
    }
  }
  return keys;
}

// Every header under lib/ that opens namespace kilter::model::cuda, parsed.
std::map<std::string, std::string> declared_kernels() {
  std::vector<Declaration> all;
  const std::filesystem::path lib = std::filesystem::path(KILTER_SOURCE_DIR) / "lib";
  for (const auto& entry : std::filesystem::recursive_directory_iterator(lib)) {
    if (!entry.is_regular_file() || entry.path().extension() != ".h") continue;
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    if (text.str().find("namespace kilter::model::cuda {") == std::string::npos) continue;
    const std::string relative = std::filesystem::relative(entry.path(), KILTER_SOURCE_DIR).string();
    for (Declaration& d : parse_declarations(text.str(), relative)) all.push_back(std::move(d));
  }
  return declaration_keys(all);
}

std::set<std::string> table_kernels() {
  std::set<std::string> kernels;
  for (const OpFamily& family : op_families())
    for (const std::string& kernel : family.kernels) kernels.insert(kernel);
  return kernels;
}

TEST(OpTableParser, FindsMembersOverloadsAndDefinitions) {
  const std::string header = R"(
    namespace kilter::model::cuda {
    using bf16 = __nv_bfloat16;
    enum class Kind { a, b };  // f(x) in a comment is not a declaration
    class Engine {
     public:
      Engine(int stream);
      ~Engine();
      Engine& operator=(const Engine&) = delete;
      void run(float* D, const float* A = nullptr, int n = f(3));
     private:
      bool plan(int key);
    };
    struct Call { void* D = nullptr; int m = 0; };
    void scale(float* x, size_t n, cudaStream_t stream);
    void scale(bf16* x, size_t n, cudaStream_t stream);
    void sums(float* out, const float* x, int n);
    void sums(float* out, const bf16* x, int n);
    inline Call make_call(void* D) { Call call; call.D = D; return call; }
    }  // namespace kilter::model::cuda
    void outside(int x);
  )";
  const auto keys = declaration_keys(parse_declarations(header, "test.h"));
  std::set<std::string> names;
  for (const auto& [key, where] : keys) names.insert(key);
  const std::set<std::string> want = {"Engine::run", "scale(fp32)", "scale(bf16)", "sums(fp32)", "sums(bf16)",
                                      "make_call"};
  EXPECT_EQ(names, want);
}

TEST(OpTableCompleteness, EveryDeclaredKernelHasARow) {
  const auto declared = declared_kernels();
  // The headers were found and read: cuda_ops.h alone declares more than 60 kernels.
  ASSERT_GT(declared.size(), 60u) << "the CUDA kernels' headers under lib/ were not found or not parsed";
  ASSERT_TRUE(declared.count("Gemm::run") && declared.count("rope_forward(bf16)") && declared.count("rope_forward(fp32)"));
  const std::set<std::string> rows = table_kernels();
  std::set<std::string> elsewhere;
  for (const CoveredElsewhere& e : covered_elsewhere()) elsewhere.insert(e.kernel);
  for (const auto& [kernel, header] : declared)
    EXPECT_TRUE(rows.count(kernel) || elsewhere.count(kernel))
        << kernel << " (declared in " << header << ") has no row in the op table: add a case that runs it against "
        << "its CPU twin to tests/gpu/op_table_cases.cpp and a runner (tests/gpu/op_table_*.cpp)";
}

TEST(OpTableCompleteness, EveryRowNamesADeclaredKernel) {
  const auto declared = declared_kernels();
  for (const std::string& kernel : table_kernels())
    EXPECT_TRUE(declared.count(kernel)) << "the op table names " << kernel << ", which no header under lib/ declares";
  for (const CoveredElsewhere& e : covered_elsewhere())
    EXPECT_TRUE(declared.count(e.kernel)) << e.kernel << " (said to be covered by " << e.test << ") is not declared";
}

TEST(OpTableCompleteness, EveryFamilyHasRowsOfItsDtype) {
  std::map<std::string, int> rows;
  std::set<std::string> names;
  for (const OpCase& c : op_cases()) {
    const OpFamily* family = find_family(c.family);
    ASSERT_NE(family, nullptr) << c.name() << ": no family " << c.family;
    EXPECT_EQ(c.dtype, family->dtype) << c.name() << ": its dtype is not its family's";
    EXPECT_TRUE(names.insert(c.name()).second) << c.name() << " twice";
    const Tolerance& t = c.tol;
    EXPECT_TRUE(t.fwd >= 0 && t.bwd >= 0 && t.fp32 >= 0 && t.scalar >= 0 && t.once <= 1 && t.chained <= 1) << c.name();
    ++rows[c.family];
  }
  for (const OpFamily& family : op_families()) EXPECT_GT(rows[family.name], 0) << family.name << " has no row";
}

// Both architectures in both dtypes: the families the two block compositions run have rows.
TEST(OpTableCompleteness, CoversBothArchitecturesInBothDtypes) {
  std::set<std::string> families;
  for (const OpCase& c : op_cases()) families.insert(c.family);
  const std::vector<std::string> gpt2 = {"encoder", "layernorm", "matmul", "gelu", "attention", "crossentropy",
                                         "encoder_bf16", "residual_norm_bf16", "linear_bf16", "gelu_bf16",
                                         "attention_bf16", "classifier_chunks_bf16", "adamw_segments"};
  const std::vector<std::string> llama = {"rmsnorm", "rope", "swiglu", "rope_bf16", "swiglu_bf16", "attention",
                                          "prefix_attention", "prefix_attention_bf16"};
  for (const auto* list : {&gpt2, &llama})
    for (const std::string& family : *list) EXPECT_TRUE(families.count(family)) << family;
  bool llama_encoder = false, gqa = false;
  for (const OpCase& c : op_cases()) {
    llama_encoder |= c.family == "encoder_bf16" && !c.shape.position_table;
    gqa |= c.family == "attention_bf16" && c.shape.NKV > 0 && c.shape.NKV < c.shape.NH;
  }
  EXPECT_TRUE(llama_encoder) << "no bf16 encoder row without a position table (the Llama family)";
  EXPECT_TRUE(gqa) << "no bf16 attention row with grouped K/V heads (the Llama family)";
}

}  // namespace
}  // namespace kilter::optable
