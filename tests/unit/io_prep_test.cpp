// `kilter prep` corpora: text directories, JSONL, fortune files; empty documents dropped and
// counted; non-UTF-8 bytes kept; missing inputs and bad JSONL lines named; atomic output.
#include <gtest/gtest.h>

#include "io/corpus.h"
#include "io_testing.h"

namespace kilter::io {
namespace {

using namespace kilter::io::testing;

// Every document of a dataset, as bytes, in global order.
std::vector<std::string> documents(const std::string& dir) {
  DatasetIndex index = load_index(dir);
  std::vector<std::string> docs;
  for (const ShardInfo& shard : index.shards) {
    std::vector<uint32_t> tokens = shard_tokens(dir + "/" + shard.file);
    uint64_t position = 0;
    for (uint64_t d = 0; d < shard.num_docs; ++d) {
      uint32_t length = index.doc_lengths[shard.first_doc + d];
      std::string doc;
      for (uint32_t i = 0; i < length; ++i) doc.push_back(char(tokens[position + i]));
      position += length;
      docs.push_back(doc);
    }
  }
  return docs;
}

PrepReport prep(const std::vector<std::string>& inputs, InputFormat format, uint32_t shards,
                const std::string& out) {
  PrepOptions options;
  options.inputs = inputs;
  options.format = format;
  options.shards = shards;
  options.out = out;
  options.progress = false;
  return prepare_dataset(options);
}

TEST(IoPrep, TextDirectoryOneDocumentPerFileSorted) {
  ScratchDir tmp;
  fs::create_directories(tmp.path("in/sub"));
  write_file(tmp.path("in/b.txt"), "second");
  write_file(tmp.path("in/a.txt"), "first\n");
  write_file(tmp.path("in/c.txt"), "");                // empty: dropped, counted
  write_file(tmp.path("in/sub/ignored.txt"), "nested");  // subdirectories are not read
  fs::create_symlink(tmp.path("in/a.txt"), tmp.path("in/link.txt"));  // links are skipped
  PrepReport report = prep({tmp.path("in")}, InputFormat::text, 1, tmp.path("out"));
  EXPECT_EQ(report.documents, 2u);
  EXPECT_EQ(report.empty_documents, 1u);
  EXPECT_EQ(report.tokens, 12u);
  EXPECT_EQ(documents(tmp.path("out")), (std::vector<std::string>{"first\n", "second"}));
  DatasetIndex index = load_index(tmp.path("out"));
  EXPECT_EQ(index.vocab_size, 257u);
  EXPECT_EQ(index.eos_id, 256u);
  EXPECT_EQ(index.tokenizer, "byte");
  EXPECT_TRUE(validate_dataset(tmp.path("out")).empty());
}

TEST(IoPrep, NonUtf8BytesAreKeptAsBytes) {
  ScratchDir tmp;
  const std::string bytes("caf\xe9 \xff\xfe\x00\x80 end", 13);
  write_file(tmp.path("latin1.txt"), bytes);
  prep({tmp.path("latin1.txt")}, InputFormat::text, 1, tmp.path("out"));
  std::vector<std::string> docs = documents(tmp.path("out"));
  ASSERT_EQ(docs.size(), 1u);
  EXPECT_EQ(docs[0], bytes);
  std::vector<uint32_t> tokens = shard_tokens(tmp.path("out/shard-00000.h5"));
  EXPECT_EQ(tokens[3], 0xe9u);
  EXPECT_EQ(tokens[5], 0xffu);
  EXPECT_EQ(tokens[7], 0u);  // NUL is a byte like any other
}

TEST(IoPrep, FortuneFormat) {
  ScratchDir tmp;
  fs::create_directories(tmp.path("f"));
  // A leading separator and a doubled one give empty documents; the last document has no
  // closing `%`; CRLF separators count too; "%%" and " %" are text.
  write_file(tmp.path("f/one"), "%\nA fortune.\n%\n%\nTwo\nlines.\n%\r\n%% not a separator\n %\nlast");
  write_file(tmp.path("f/one.dat"), "binary index that must be skipped");
  write_file(tmp.path("f/two"), "B\n%\n");
  fs::create_symlink(tmp.path("f/two"), tmp.path("f/two.u8"));
  PrepReport report = prep({tmp.path("f")}, InputFormat::fortune, 2, tmp.path("out"));
  EXPECT_EQ(documents(tmp.path("out")),
            (std::vector<std::string>{"A fortune.\n", "Two\nlines.\n", "%% not a separator\n %\nlast",
                                      "B\n"}));
  EXPECT_EQ(report.empty_documents, 2u);
  EXPECT_EQ(report.shards, 2u);
}

TEST(IoPrep, JsonlTextField) {
  ScratchDir tmp;
  write_file(tmp.path("a.jsonl"),
             "{\"text\": \"hello\", \"id\": 1}\n"
             "\n"
             "{\"text\": \"\"}\n"
             "{\"text\": \"caf\\u00e9 \\n tab\\t\"}\n");
  PrepReport report = prep({tmp.path("a.jsonl")}, InputFormat::jsonl, 1, tmp.path("out"));
  EXPECT_EQ(report.empty_documents, 1u);
  EXPECT_EQ(documents(tmp.path("out")), (std::vector<std::string>{"hello", "caf\xc3\xa9 \n tab\t"}));
}

TEST(IoPrep, BadJsonlLineIsNamed) {
  ScratchDir tmp;
  write_file(tmp.path("bad.jsonl"), "{\"text\": \"ok\"}\n{\"text\": broken}\n");
  expect_error([&] { prep({tmp.path("bad.jsonl")}, InputFormat::jsonl, 1, tmp.path("out")); },
               {"bad.jsonl:2", "not valid JSON"});
  write_file(tmp.path("nofield.jsonl"), "{\"body\": \"x\"}\n");
  expect_error([&] { prep({tmp.path("nofield.jsonl")}, InputFormat::jsonl, 1, tmp.path("out")); },
               {"nofield.jsonl:1", "string field \"text\""});
  EXPECT_FALSE(fs::exists(tmp.path("out")));  // nothing half-written
}

TEST(IoPrep, MissingInputIsNamed) {
  ScratchDir tmp;
  write_file(tmp.path("real.txt"), "x");
  expect_error([&] { prep({tmp.path("real.txt"), tmp.path("nope.txt")}, InputFormat::text, 1, tmp.path("out")); },
               {"nope.txt", "does not exist"});
  EXPECT_FALSE(fs::exists(tmp.path("out")));
}

TEST(IoPrep, OnlyEmptyDocumentsIsAnError) {
  ScratchDir tmp;
  write_file(tmp.path("empty.txt"), "");
  expect_error([&] { prep({tmp.path("empty.txt")}, InputFormat::text, 1, tmp.path("out")); },
               {"no non-empty documents", "1 empty"});
}

TEST(IoPrep, ExistingOutputIsKeptUnlessForced) {
  ScratchDir tmp;
  write_file(tmp.path("a.txt"), "abc");
  prep({tmp.path("a.txt")}, InputFormat::text, 1, tmp.path("out"));
  expect_error([&] { prep({tmp.path("a.txt")}, InputFormat::text, 1, tmp.path("out")); },
               {"exists and is not empty", "--force"});
  write_file(tmp.path("b.txt"), "abcdef");
  PrepOptions options;
  options.inputs = {tmp.path("b.txt")};
  options.out = tmp.path("out");
  options.force = true;
  options.progress = false;
  prepare_dataset(options);
  EXPECT_EQ(documents(tmp.path("out")), (std::vector<std::string>{"abcdef"}));
  // No temporary or old directory is left next to the output.
  int entries = 0;
  for (const auto& entry : fs::directory_iterator(tmp.path())) entries += entry.is_directory();
  EXPECT_EQ(entries, 1);
}

TEST(IoPrep, FailureLeavesNoPartialDataset) {
  ScratchDir tmp;
  write_file(tmp.path("a.txt"), "abc");
  // More shards than documents fails after the first pass, before anything is renamed.
  expect_error([&] { prep({tmp.path("a.txt")}, InputFormat::text, 3, tmp.path("out")); },
               {"--shards 3 exceeds"});
  EXPECT_FALSE(fs::exists(tmp.path("out")));
  for (const auto& entry : fs::directory_iterator(tmp.path()))
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos) << entry.path();
}

TEST(IoPrep, DocumentsLargerThanTheBuffersStreamThrough) {
  ScratchDir tmp;
  // 2.5 MiB in one document: crosses the 1 MiB read blocks and the 1 M-token write buffer.
  std::string big(size_t(5) << 19, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = char((i * 2654435761u) >> 13);
  write_file(tmp.path("big.txt"), big);
  write_file(tmp.path("small.txt"), "tail");
  PrepReport report = prep({tmp.path("big.txt"), tmp.path("small.txt")}, InputFormat::text, 2, tmp.path("out"));
  EXPECT_EQ(report.tokens, big.size() + 4);
  EXPECT_EQ(documents(tmp.path("out")), (std::vector<std::string>{big, "tail"}));
  EXPECT_TRUE(validate_dataset(tmp.path("out")).empty());
}

TEST(IoPrep, UnknownFormatIsNamed) {
  expect_error([] { parse_input_format("csv"); }, {"--format", "csv"});
}

}  // namespace
}  // namespace kilter::io
