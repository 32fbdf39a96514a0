#include "cli/run_command.h"

#include <sentinel/errors.h>
#include <sentinel/watchdog.h>

#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/cuda.h>
#include <torch/script.h>
#include <regex>

#include <fstream>
#include <iostream>
#include <iterator>

namespace sentinel {
namespace cli {

namespace {

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

std::string describe(const c10::IValue& v) { return v.tagKind(); }

std::vector<c10::IValue> batch_arguments(const c10::IValue& batch, size_t i) {
  std::vector<c10::IValue> args;
  if (batch.isTensor()) {
    args.push_back(batch);
  } else if (batch.isTuple()) {
    for (const auto& e : batch.toTupleRef().elements()) args.push_back(e);
  } else if (batch.isList()) {
    for (const auto& e : batch.toListRef()) args.push_back(e);
  } else {
    throw InputError("batch " + std::to_string(i) + " is a " + describe(batch) +
                     "; expected a tensor or a tuple/list of tensors (the model's positional arguments)");
  }
  return args;
}

}  // namespace

torch::jit::Module load_model(const std::string& path) {
  if (!std::ifstream(path)) throw InputError("cannot open model file '" + path + "'");
  try {
    return torch::jit::load(path);
  } catch (const c10::Error& e) {
    throw InputError("'" + path + "' is not a TorchScript model (torch.jit.save): " + first_line(e.what_without_backtrace()));
  }
}

std::vector<std::vector<c10::IValue>> load_batches(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError("cannot open inputs file '" + path + "'");
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c10::IValue data;
  try {
    data = torch::jit::pickle_load(bytes);
  } catch (const c10::Error& e) {
    throw InputError("'" + path + "' could not be read as a torch.save file: " + first_line(e.what_without_backtrace()));
  }
  std::vector<c10::IValue> items;
  if (data.isList()) {
    for (const auto& b : data.toListRef()) items.push_back(b);
  } else if (data.isTuple()) {
    for (const auto& b : data.toTupleRef().elements()) items.push_back(b);
  } else {
    throw InputError("'" + path + "' holds a " + describe(data) +
                     "; expected a list of batches, as written by torch.save([batch0, batch1, ...])");
  }
  if (items.empty()) throw InputError("'" + path + "' holds no batches");
  std::vector<std::vector<c10::IValue>> batches;
  for (size_t i = 0; i < items.size(); ++i) {
    auto args = batch_arguments(items[i], i);
    for (size_t a = 0; a < args.size(); ++a) {
      if (!args[a].isTensor()) {
        throw InputError("batch " + std::to_string(i) + " argument " + std::to_string(a) + " is a " +
                         describe(args[a]) + "; expected a tensor");
      }
    }
    batches.push_back(std::move(args));
  }
  return batches;
}

void cast_floating(torch::jit::Module& model, std::vector<std::vector<c10::IValue>>& batches,
                   const std::string& dtype) {
  const c10::ScalarType type = dtype == "bfloat16" ? c10::kBFloat16
                               : dtype == "float16" ? c10::kHalf
                               : dtype == "float32" ? c10::kFloat
                                                    : throw OptionError("sentinel: --dtype '" + dtype +
                                                                        "' is not one of bfloat16, float16, float32");
  torch::NoGradGuard no_grad;
  // Parameters and buffers in place (set_data keeps the module's slots), as Module::to would,
  // but without casting integer buffers such as BatchNorm's num_batches_tracked.
  auto cast = [&](const at::Tensor& t) {
    if (t.defined() && at::isFloatingType(t.scalar_type()) && t.scalar_type() != type) {
      at::Tensor(t).set_data(t.to(type));
    }
  };
  for (const auto& p : model.parameters()) cast(p);
  for (const auto& b : model.buffers()) cast(b);
  for (auto& batch : batches) {
    for (auto& arg : batch) {
      const at::Tensor t = arg.toTensor();
      if (at::isFloatingType(t.scalar_type())) arg = t.to(type);
    }
  }
}

void move_to_device(torch::jit::Module& model, std::vector<std::vector<c10::IValue>>& batches,
                    const std::string& device) {
  std::smatch m;
  static const std::regex form("(cpu|cuda)(?::([0-9]{1,4}))?");
  if (!std::regex_match(device, m, form) || (m[1] == "cpu" && m[2].matched)) {
    throw OptionError("sentinel: --device '" + device + "' is not cpu, cuda or cuda:N");
  }
  if (m[1] == "cpu") return;
  if (!at::hasCUDA()) {
    throw OptionError("sentinel: --device " + device +
                      ": this LibTorch was built without CUDA; run on the CPU, or build against a CUDA LibTorch "
                      "(docs/usage.md, \"CUDA tensors\")");
  }
  const int64_t count = static_cast<int64_t>(torch::cuda::device_count());
  if (count == 0) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    throw OptionError("sentinel: --device " + device + ": no CUDA device is visible" +
                      (visible ? std::string(" (CUDA_VISIBLE_DEVICES=") + visible + ")" : std::string()));
  }
  const int64_t index = m[2].matched ? std::stoll(m[2].str()) : 0;
  if (index >= count) {
    throw OptionError("sentinel: --device " + device + ": there " + (count == 1 ? "is 1 CUDA device" : "are " + std::to_string(count) + " CUDA devices") +
                      ", numbered from 0");
  }
  const c10::Device target(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
  model.to(target);
  for (auto& batch : batches) {
    for (auto& arg : batch) arg = arg.toTensor().to(target);
  }
}

int run_batches(torch::jit::Module& model, const std::vector<std::vector<c10::IValue>>& batches,
                const Options& options) {
  model.eval();
  torch::NoGradGuard no_grad;
  DebugUnderflowOverflow<torch::jit::Module> debug(model, options);
  std::ostream& out = options.output();
  for (size_t i = 0; i < batches.size(); ++i) {
    try {
      debug.forward(batches[i]);
    } catch (const NonFiniteError& e) {
      out << "sentinel: inf/nan detected in batch " << e.report().batch_number << " of " << batches.size()
          << "; stopped.\n";
      return kNonFinite;
    } catch (const AbortAfterBatch& e) {
      if (debug.last_report()) {
        out << "sentinel: stopped after batch " << e.batch() << " (--abort-after); inf/nan was detected (reported above).\n";
        return kNonFinite;
      }
      out << "sentinel: stopped after batch " << e.batch() << " (--abort-after); no inf/nan in batches 0.."
          << e.batch() << ".\n";
      return kClean;
    } catch (const c10::Error& e) {
      throw InputError("the model failed on batch " + std::to_string(i) + ": " + first_line(e.what_without_backtrace()));
    }
  }
  if (options.action() == Action::Warn && debug.last_report()) {
    out << "sentinel: ran " << batches.size() << " batches; inf/nan detected (reported above).\n";
    return kNonFinite;
  }
  out << "sentinel: ran " << batches.size() << " batches; no inf/nan detected.\n";
  return kClean;
}

}  // namespace cli
}  // namespace sentinel
