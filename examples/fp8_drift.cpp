// FP8 bring-up on an fp32 training loop: would delayed scaling keep up with this model?
// A layer's activations grow as training goes (here: the inputs are scaled up step by step), so
// delayed scaling, which sets each step's scale from earlier amaxes, falls behind. The drift
// alarm stops the loop while overflows are still rare.
#include <sentinel/sentinel.h>
#include <torch/torch.h>

#include <iostream>

struct NetImpl : torch::nn::Module {
  NetImpl() {
    embed = register_module("embed", torch::nn::Linear(32, 128));
    head = register_module("head", torch::nn::Linear(128, 1));
  }
  torch::Tensor forward(torch::Tensor x) { return head(torch::relu(embed(x))); }
  torch::nn::Linear embed{nullptr}, head{nullptr};
};
TORCH_MODULE(Net);

int main() {
  torch::manual_seed(0);
  Net model;
  torch::optim::SGD optimizer(model->parameters(), 1e-3);
  auto options = sentinel::Options().fp8(sentinel::Fp8Options()
                                             .enabled(true)
                                             .layers("embed")  // the layer under suspicion
                                             .recipe(sentinel::fp8::Recipe().amax_history_len(8))
                                             .overflow_alarm(0.01)
                                             .drift_alarm(0.3)
                                             .alarm_action(sentinel::Action::Throw));
  sentinel::DebugUnderflowOverflow debug(model, options);
  auto x = torch::randn({128, 32});
  try {
    for (int step = 0; step < 50; ++step) {
      const double growth = step < 5 ? 1.0 : std::pow(1.3, step - 4);
      optimizer.zero_grad();
      auto loss = debug.forward(x * growth).pow(2).mean();
      debug.backward(loss);  // closes the FP8 step: forward, backward and gradients
      optimizer.step();
    }
  } catch (const sentinel::Fp8AlarmError& e) {
    const auto& alarm = e.report().fp8_alarms.front();
    std::cout << "\nstopped at step " << e.report().batch_number << ": " << alarm.metrics.module_path << " "
              << alarm.metrics.role << " - " << alarm.reason << " (overflow so far "
              << alarm.metrics.overflow_pct << "%)\n";
    return alarm.metrics.overflow_pct < 1.0 ? 0 : 1;
  }
  std::cerr << "no FP8 alarm: the example expects one\n";
  return 1;
}
