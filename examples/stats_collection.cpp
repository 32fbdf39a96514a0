// The FP8 debug tools' statistics on a small transformer trained with the C++ frontend, driven by
// a YAML config as TransformerEngine's are (examples/configs/debug_config.yaml, or the file named
// by $SENTINEL_CONFIG): per selected layer, tensor and step, min/max/mean/std/norms, amax,
// dynamic range and FP8 underflow/overflow percentages, logged under the config's log_dir as
// text, JSON lines and TensorBoard event files; the fc2 layers' GEMM tensors saved for torch.load.
#include <sentinel/sentinel.h>
#include <torch/torch.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>

struct BlockImpl : torch::nn::Module {
  BlockImpl() {
    attn = register_module("attn", torch::nn::ModuleDict());
    attn->update({{"qkv", torch::nn::Linear(32, 96).ptr()}, {"proj", torch::nn::Linear(32, 32).ptr()}});
    mlp = register_module("mlp", torch::nn::ModuleDict());
    mlp->update({{"fc1", torch::nn::Linear(32, 128).ptr()}, {"fc2", torch::nn::Linear(128, 32).ptr()}});
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({32})));
  }
  torch::Tensor forward(torch::Tensor x) {  // x: [tokens, 32]; one head, no mask: small on purpose
    auto qkv = attn["qkv"]->as<torch::nn::Linear>()->forward(norm(x)).chunk(3, -1);
    auto weights = torch::softmax(torch::matmul(qkv[0], qkv[1].t()) / std::sqrt(32.0), -1);
    x = x + attn["proj"]->as<torch::nn::Linear>()->forward(torch::matmul(weights, qkv[2]));
    auto h = torch::gelu(mlp["fc1"]->as<torch::nn::Linear>()->forward(x));
    return x + mlp["fc2"]->as<torch::nn::Linear>()->forward(h);
  }
  torch::nn::ModuleDict attn{nullptr}, mlp{nullptr};
  torch::nn::LayerNorm norm{nullptr};
};
TORCH_MODULE(Block);

struct TinyTransformerImpl : torch::nn::Module {
  TinyTransformerImpl() {
    layers = register_module("layers", torch::nn::ModuleList(Block(), Block()));
    head = register_module("head", torch::nn::Linear(32, 1));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (const auto& layer : *layers) x = layer->as<Block>()->forward(x);
    return head(x);
  }
  torch::nn::ModuleList layers{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(TinyTransformer);

int main(int argc, char** argv) {
  const char* env = std::getenv("SENTINEL_CONFIG");
  const std::string config = argc > 1 ? argv[1] : (env && *env ? env : SENTINEL_EXAMPLE_CONFIG);
  torch::manual_seed(0);
  TinyTransformer model;
  torch::optim::Adam optimizer(model->parameters(), 1e-3);
  try {
    sentinel::Options options = sentinel::Options::from_yaml(config);
    sentinel::DebugUnderflowOverflow debug(model, options);
    for (int step = 0; step < 8; ++step) {
      auto x = torch::randn({16, 32});
      optimizer.zero_grad();
      auto loss = debug.forward(x).pow(2).mean();
      debug.backward(loss);  // the step's statistics go to the loggers here
      optimizer.step();
    }
    const std::vector<sentinel::StatRecord> records = debug.collected_stats();
    std::cout << "last collected step's statistics (" << records.size() << " records), first few:\n";
    for (size_t i = 0; i < records.size() && i < 6; ++i) {
      const auto& r = records[i];
      std::cout << "  step " << r.step << " " << r.layer << " " << r.tensor << " " << r.stat << " = " << r.value << "\n";
    }
    const std::string stats_log = options.log_dir() + "/debug_statistics_logs/sentinel_rank-0.log";
    std::ifstream log(stats_log);
    if (!log) {
      std::cerr << "no statistics log at " << stats_log << "\n";
      return 1;
    }
    std::cout << "statistics log: " << stats_log << "\n";
  } catch (const sentinel::Error& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  return 0;
}
