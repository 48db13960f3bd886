// The block schedule (lib/model/block_schedule.h) on a recording op table: the steps every datapath
// runs, in their order, for gpt2 and llama, each recompute mode and cut pieces' K/V exchange. The
// numbers are checked elsewhere (fingerprints, the model tests); here the composition the CUDA
// datapaths share with the CPU: the exchange's calls in kv_exchange.h's order, a rerun without
// exchange calls, every Linear's backward reading the input its forward read.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "lib/model/block_schedule.h"
#include "tests/unit/model_testing.h"

namespace kilter::model {
namespace {

const char* name(Act a) {
  static const char* names[] = {"ln1", "qkv", "atty", "ln2", "fch", "fch_act", "next_ln", "spare"};
  return names[static_cast<int>(a)];
}
const char* name(Stream s) { return s == Stream::in ? "in" : s == Stream::mid ? "mid" : "out"; }
const char* name(Linear l) {
  static const char* names[] = {"Wqkv", "Wproj", "Wfc", "Wfcproj"};
  return names[static_cast<int>(l)];
}
const char* name(Grad g) {
  static const char* names[] = {"dresidual", "dln", "datty", "dqkv", "dfch", "dact"};
  return names[static_cast<int>(g)];
}
const char* name(AttentionPieces p) {
  return p == AttentionPieces::all ? "all" : p == AttentionPieces::with_prefix ? "with_prefix" : "without_prefix";
}

// Every entry as one line: "L<layer> <entry> <arguments>".
class RecordingOps final : public BlockOps {
 public:
  explicit RecordingOps(bool exchanging) : exchanging_(exchanging) {}
  std::vector<std::string> calls;

  void norm(const NormArgs& a) override { add(a.layer, "norm", {name(a.out), name(a.in)}); }
  void linear(const LinearArgs& a) override { add(a.layer, "linear", {name(a.out), name(a.in), name(a.weight)}); }
  void linear_gelu(const LinearGeluArgs& a) override {
    add(a.layer, "linear_gelu", {name(a.out), name(a.pre_gelu), name(a.in), name(a.weight)});
  }
  void projection_residual_norm(const ResidualNormArgs& a) override {
    add(a.layer, "residual_norm", {name(a.out), name(a.residual), name(a.in), name(a.weight), name(a.norm_out)});
  }
  void gelu(const ActivationArgs& a) override { add(a.layer, "gelu", {name(a.out), name(a.in)}); }
  void swiglu(const ActivationArgs& a) override { add(a.layer, "swiglu", {name(a.out), name(a.in)}); }
  void rope(const LayerArgs& a) override { add(a.layer, "rope", {}); }
  void attention(const AttentionArgs& a) override { add(a.layer, "attention", {name(a.out), name(a.pieces)}); }
  bool exchanging() const override { return exchanging_; }
  void kv_send(const LayerArgs& a) override { add(a.layer, "kv_send", {}); }
  void kv_wait(const LayerArgs& a) override { add(a.layer, "kv_wait", {}); }
  void linear_backward(const LinearBackwardArgs& a) override {
    add(a.layer, "linear_backward", {name(a.dinp), name(a.dout), name(a.in), name(a.weight)});
  }
  void linear_gelu_backward(const LinearGeluBackwardArgs& a) override {
    add(a.layer, "linear_gelu_backward", {name(a.dinp), name(a.dout), name(a.in), name(a.weight), name(a.pre_gelu)});
  }
  void swiglu_backward(const ActivationBackwardArgs& a) override {
    add(a.layer, "swiglu_backward", {name(a.dinp), name(a.dout), name(a.in)});
  }
  void norm_backward(const NormBackwardArgs& a) override {
    add(a.layer, "norm_backward", {name(a.dinp), name(a.dout), name(a.in), name(a.norm)});
  }
  void rope_backward(const LayerArgs& a) override { add(a.layer, "rope_backward", {}); }
  void attention_backward(const AttentionBackwardArgs& a) override {
    add(a.layer, "attention_backward", {name(a.pieces)});
  }
  void kv_send_grads(const LayerArgs& a) override { add(a.layer, "kv_send_grads", {}); }
  void kv_wait_add_grads(const LayerArgs& a) override { add(a.layer, "kv_wait_add_grads", {}); }

 private:
  void add(int layer, const char* entry, std::vector<const char*> args) {
    std::string line = "L" + std::to_string(layer) + " " + entry;
    for (const char* arg : args) line += std::string(" ") + arg;
    calls.push_back(line);
  }
  bool exchanging_;
};

ModelSpec spec_of(const char* arch) {
  ModelSpec spec = std::string(arch) == "llama" ? testing::tiny_llama_config(16, 11) : testing::tiny_config();
  return spec;
}

std::vector<std::string> backward_of(const ModelSpec& spec, Recompute recompute, bool exchanging, int layer) {
  RecordingOps ops(exchanging);
  BlockSchedule(spec, recompute).block_backward(ops, layer);
  return ops.calls;
}

size_t position(const std::vector<std::string>& calls, const std::string& call) {
  const auto it = std::find(calls.begin(), calls.end(), call);
  EXPECT_NE(it, calls.end()) << call;
  EXPECT_EQ(std::count(calls.begin(), calls.end(), call), 1) << call;
  return static_cast<size_t>(it - calls.begin());
}

TEST(BlockSchedule, Gpt2ForwardIsLlmcsOrderWithTheNextNormFused) {
  RecordingOps ops(false);
  BlockSchedule(testing::tiny_config(), Recompute::none).forward(ops);
  const std::vector<std::string> want = {
      "L0 norm ln1 in",
      "L0 linear qkv ln1 Wqkv",
      "L0 attention atty all",
      "L0 residual_norm mid in atty Wproj ln2",
      "L0 linear_gelu fch_act fch ln2 Wfc",
      "L0 residual_norm out mid fch_act Wfcproj next_ln",
      "L1 linear qkv ln1 Wqkv",
      "L1 attention atty all",
      "L1 residual_norm mid in atty Wproj ln2",
      "L1 linear_gelu fch_act fch ln2 Wfc",
      "L1 residual_norm out mid fch_act Wfcproj next_ln",
  };
  EXPECT_EQ(ops.calls, want);
}

TEST(BlockSchedule, LlamaRotatesQkvAndRunsSwiglu) {
  const ModelSpec spec = spec_of("llama");
  RecordingOps ops(false);
  BlockSchedule(spec, Recompute::none).block_forward(ops, 1, false);
  const std::vector<std::string> want = {
      "L1 linear qkv ln1 Wqkv",
      "L1 rope",
      "L1 attention atty all",
      "L1 residual_norm mid in atty Wproj ln2",
      "L1 linear fch ln2 Wfc",
      "L1 swiglu fch_act fch",
      "L1 residual_norm out mid fch_act Wfcproj next_ln",
  };
  EXPECT_EQ(ops.calls, want);
  const std::vector<std::string> back = backward_of(spec, Recompute::none, false, 1);
  EXPECT_LT(position(back, "L1 linear_backward dact dresidual fch_act Wfcproj"),
            position(back, "L1 swiglu_backward dfch dact fch"));
  // RoPE's backward after attention's (and the exchange's dK/dV), before the QKV projection's.
  EXPECT_LT(position(back, "L1 attention_backward all"), position(back, "L1 rope_backward"));
  EXPECT_LT(position(back, "L1 rope_backward"), position(back, "L1 linear_backward dln dqkv ln1 Wqkv"));
}

// Each Linear's backward reads the input its forward read, and the gradient chain is closed: a
// backward's output gradient is the residual stream's or the previous step's input gradient.
TEST(BlockSchedule, EveryLinearBackwardReadsItsForwardInput) {
  for (const char* arch : {"gpt2", "llama"}) {
    const ModelSpec spec = spec_of(arch);
    RecordingOps forward(false);
    BlockSchedule(spec, Recompute::none).block_forward(forward, 0, false);
    std::map<std::string, std::string> input_of;  // weight -> its forward input
    for (const std::string& call : forward.calls) {
      std::vector<std::string> w;
      std::string word;
      for (char c : call + " ")
        if (c == ' ') w.push_back(word), word.clear();
        else word += c;
      if (w[1] == "linear") input_of[w[4]] = w[3];
      if (w[1] == "linear_gelu") input_of[w[5]] = w[4];
      if (w[1] == "residual_norm") input_of[w[5]] = w[4];
    }
    ASSERT_EQ(input_of.size(), 4u) << arch;
    int seen = 0;
    for (const std::string& call : backward_of(spec, Recompute::none, false, 0)) {
      if (call.find("linear_backward") == std::string::npos && call.find("linear_gelu_backward") == std::string::npos)
        continue;
      const std::string words = call + " ";
      for (const auto& [weight, in] : input_of)
        if (words.find(" " + weight + " ") != std::string::npos) {
          EXPECT_NE(words.find(" " + in + " " + weight + " "), std::string::npos) << arch << ": " << call;
          ++seen;
        }
    }
    EXPECT_EQ(seen, 4) << arch;
  }
}

// kv_exchange.h's order: forward_send, the pieces without a prefix, forward_wait, the later
// parts; backward the later parts, backward_send, the other pieces, backward_wait_add, then the
// QKV projection's backward. A rerun (recompute) sends and waits for nothing.
TEST(BlockSchedule, ExchangeCallsInKvExchangeOrder) {
  for (const char* arch : {"gpt2", "llama"}) {
    const ModelSpec spec = spec_of(arch);
    RecordingOps ops(true);
    BlockSchedule(spec, Recompute::none).block_forward(ops, 0, false);
    const std::vector<std::string>& f = ops.calls;
    EXPECT_LT(position(f, "L0 linear qkv ln1 Wqkv"), position(f, "L0 kv_send")) << arch;
    EXPECT_LT(position(f, "L0 kv_send"), position(f, "L0 attention atty without_prefix")) << arch;
    EXPECT_LT(position(f, "L0 attention atty without_prefix"), position(f, "L0 kv_wait")) << arch;
    EXPECT_LT(position(f, "L0 kv_wait"), position(f, "L0 attention atty with_prefix")) << arch;
    for (Recompute recompute : {Recompute::none, Recompute::gelu, Recompute::attention, Recompute::block}) {
      const std::vector<std::string> b = backward_of(spec, recompute, true, 0);
      EXPECT_EQ(std::count(b.begin(), b.end(), "L0 kv_send"), 0) << arch;
      EXPECT_EQ(std::count(b.begin(), b.end(), "L0 kv_wait"), 0) << arch;
      EXPECT_LT(position(b, "L0 attention_backward with_prefix"), position(b, "L0 kv_send_grads")) << arch;
      EXPECT_LT(position(b, "L0 kv_send_grads"), position(b, "L0 attention_backward without_prefix")) << arch;
      EXPECT_LT(position(b, "L0 attention_backward without_prefix"), position(b, "L0 kv_wait_add_grads")) << arch;
      EXPECT_LT(position(b, "L0 kv_wait_add_grads"), position(b, "L0 linear_backward dln dqkv ln1 Wqkv")) << arch;
    }
  }
}

// What each mode reruns at the start of (or within) a block's backward.
TEST(BlockSchedule, RecomputeRerunsWhatTheForwardDropped) {
  const ModelSpec spec = testing::tiny_config();
  const std::vector<std::string> none = backward_of(spec, Recompute::none, false, 1);
  EXPECT_EQ(none.front(), "L1 linear_gelu_backward dfch dresidual fch_act Wfcproj fch");
  EXPECT_EQ(backward_of(spec, Recompute::gelu, false, 1).front(), "L1 gelu fch_act fch");
  const std::vector<std::string> attention = backward_of(spec, Recompute::attention, false, 1);
  EXPECT_LT(position(attention, "L1 linear_backward datty dresidual atty Wproj"),
            position(attention, "L1 attention spare all"));
  EXPECT_LT(position(attention, "L1 attention spare all"), position(attention, "L1 attention_backward all"));
  // block: the forward from ln1 to the MLP's activation, then the backward of none.
  const std::vector<std::string> block = backward_of(spec, Recompute::block, false, 1);
  const std::vector<std::string> rerun = {
      "L1 norm ln1 in",
      "L1 linear qkv ln1 Wqkv",
      "L1 attention atty all",
      "L1 residual_norm mid in atty Wproj ln2",
      "L1 linear_gelu fch_act fch ln2 Wfc",
  };
  ASSERT_EQ(block.size(), rerun.size() + none.size());
  EXPECT_TRUE(std::equal(rerun.begin(), rerun.end(), block.begin()));
  EXPECT_TRUE(std::equal(none.begin(), none.end(), block.begin() + long(rerun.size())));
}

}  // namespace
}  // namespace kilter::model
