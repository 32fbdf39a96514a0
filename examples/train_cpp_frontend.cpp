// A C++-frontend training loop under the watchdog: forward, backward and the optimizer step of
// each iteration are one batch. The learning rate is far too high, so the weights blow up; the
// watchdog stops the run at the first inf/nan and says where it appeared.
#include <sentinel/sentinel.h>
#include <torch/torch.h>

#include <iostream>

struct RegressorImpl : torch::nn::Module {
  RegressorImpl() {
    hidden = register_module("hidden", torch::nn::Linear(8, 32));
    out = register_module("out", torch::nn::Linear(32, 1));
  }
  torch::Tensor forward(torch::Tensor x) {
    auto scope = sentinel::scope(*this);  // names the ops between the layers after this module
    return out(torch::relu(hidden(x)));
  }
  torch::nn::Linear hidden{nullptr}, out{nullptr};
};
TORCH_MODULE(Regressor);

int main() {
  torch::manual_seed(0);
  Regressor model;
  torch::optim::SGD optimizer(model->parameters(), /*lr=*/5.0);
  auto x = torch::randn({64, 8});
  auto y = x.sum(1, /*keepdim=*/true);

  sentinel::Watchdog watch(model.ptr(), sentinel::Options().max_frames_to_save(8));
  try {
    for (int step = 0; step < 200; ++step) {
      auto batch = watch.batch();
      optimizer.zero_grad();
      auto loss = torch::mse_loss(model->forward(x), y);
      loss.backward();
      optimizer.step();
      batch.finish();  // delivers a detection as sentinel::NonFiniteError
      if (step % 5 == 0) std::cout << "step " << step << " loss " << loss.item<float>() << "\n";
    }
  } catch (const sentinel::NonFiniteError& e) {
    std::cout << "\nstopped at batch " << e.report().batch_number << " in "
              << e.report().trigger().module_path << " (" << e.report().trigger().op << ")\n";
    return 0;
  }
  std::cerr << "the training never diverged: the example expects it to\n";
  return 1;
}
