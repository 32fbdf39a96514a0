#include "cli/demo_model.h"

#include <torch/torch.h>

namespace sentinel {
namespace demo {

namespace {

constexpr int64_t kModel = 16;
constexpr int64_t kFeedForward = 32;

torch::jit::Module linear(int64_t in, int64_t out) {
  torch::jit::Module m("Linear");
  m.register_parameter("weight", torch::randn({out, in}) / std::sqrt(static_cast<double>(in)), false);
  m.define(R"(
def forward(self, x):
    return torch.matmul(x, self.weight.t())
)");
  return m;
}

// T5's gated-GELU feed-forward: wo(gelu(wi_0(x)) * wi_1(x)). The product is where fp32
// overflows first: it squares the scale of its input.
torch::jit::Module dense_gated_gelu() {
  torch::jit::Module m("T5DenseGatedGeluDense");
  m.register_module("wi_0", linear(kModel, kFeedForward));
  m.register_module("wi_1", linear(kModel, kFeedForward));
  m.register_module("wo", linear(kFeedForward, kModel));
  m.define(R"(
def forward(self, hidden_states):
    hidden_gelu = torch.gelu(self.wi_0.forward(hidden_states))
    hidden_linear = self.wi_1.forward(hidden_states)
    hidden_states = hidden_gelu * hidden_linear
    return self.wo.forward(hidden_states)
)");
  return m;
}

torch::jit::Module layer_ff() {
  torch::jit::Module m("T5LayerFF");
  m.register_module("DenseReluDense", dense_gated_gelu());
  m.define(R"(
def forward(self, hidden_states):
    return hidden_states + self.DenseReluDense.forward(hidden_states)
)");
  return m;
}

torch::jit::Module block() {
  torch::jit::Module m("T5Block");
  m.register_module("layer_ff", layer_ff());
  m.define(R"(
def forward(self, hidden_states):
    return self.layer_ff.forward(hidden_states)
)");
  return m;
}

}  // namespace

torch::jit::Module make_t5_encoder() {
  torch::manual_seed(0);
  torch::jit::Module stack("T5Stack");
  stack.register_module("block_0", block());
  stack.register_module("block_1", block());
  stack.define(R"(
def forward(self, hidden_states):
    hidden_states = self.block_0.forward(hidden_states)
    return self.block_1.forward(hidden_states)
)");
  torch::jit::Module model("T5EncoderModel");
  model.register_module("encoder", stack);
  model.define(R"(
def forward(self, hidden_states):
    return self.encoder.forward(hidden_states)
)");
  model.eval();
  return model;
}

std::vector<std::vector<c10::IValue>> make_batches() {
  // Each block roughly squares the scale of its input (x + f(x), f quadratic for large x), so
  // the second block's product meets ~scale^4: fine at 1e6, overflowing float32 at 1e10.
  const double kScales[] = {1.0, 1e2, 1e6, 1e10, 1.0};
  torch::manual_seed(1);
  std::vector<std::vector<c10::IValue>> batches;
  for (double s : kScales) batches.push_back({torch::randn({2, 4, kModel}) * s});
  return batches;
}

}  // namespace demo
}  // namespace sentinel
