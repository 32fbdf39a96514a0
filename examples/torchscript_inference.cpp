// Inference on a TorchScript model: each model.forward() is one batch, found automatically.
// Usage: example_torchscript_inference [model.pt]   (or SENTINEL_EXAMPLE_MODEL)
#include <sentinel/sentinel.h>
#include <torch/script.h>

#include <cstdlib>
#include <iostream>
#include <limits>

int main(int argc, char** argv) {
  const char* path = argc > 1 ? argv[1] : std::getenv("SENTINEL_EXAMPLE_MODEL");
  if (!path) {
    std::cerr << "usage: " << argv[0] << " model.pt\n";
    return 2;
  }
  torch::jit::Module model = torch::jit::load(path);
  model.eval();
  torch::NoGradGuard no_grad;

  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().max_frames_to_save(5));
  for (int batch = 0; batch < 4; ++batch) {
    auto x = torch::randn({2, 4});
    if (batch == 2) x[0][0] = std::numeric_limits<float>::infinity();  // a request with a bad value
    try {
      auto y = debug.forward({x}).toTensor();
      std::cout << "batch " << batch << ": output sum " << y.sum().item<float>() << "\n";
    } catch (const sentinel::NonFiniteError& e) {
      // The report was printed when the value appeared; serving goes on with the next request.
      std::cout << "batch " << batch << " rejected: inf/nan from " << e.report().trigger().module_path << "\n";
    }
  }
  return debug.last_report() && debug.last_report()->batch_number == 2 ? 0 : 1;
}
