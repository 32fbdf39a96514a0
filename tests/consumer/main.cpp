// A downstream program: only the installed headers and sentinel::sentinel.
#include <sentinel/sentinel.h>
#include <torch/torch.h>

#include <iostream>
#include <sstream>

int main() {
  torch::nn::Linear model(3, 2);
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out));
  debug.forward(torch::ones({1, 3}));
  try {
    debug.forward(torch::full({1, 3}, std::numeric_limits<float>::infinity()));
  } catch (const sentinel::NonFiniteError& e) {
    std::cout << "consumer: caught the report for batch " << e.report().batch_number << "\n";
    return e.report().batch_number == 1 ? 0 : 1;
  }
  std::cerr << "consumer: no inf/nan detected\n";
  return 1;
}
