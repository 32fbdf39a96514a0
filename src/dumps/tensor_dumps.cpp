#include "dumps/tensor_dumps.h"
#include "report/json_text.h"

#include <sentinel/errors.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include "capture/op_call.h"
#include <torch/csrc/jit/serialization/pickle.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <ostream>

namespace sentinel {
namespace dumps {

namespace fs = std::filesystem;

namespace {

// Writes and checks every byte: a full disk must be said, not leave a truncated file behind.
std::string write_file(const fs::path& path, const std::vector<char>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return fmt::format("cannot create '{}': {}", path.string(), std::strerror(errno));
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  f.flush();
  if (!f) {
    const std::string why = std::strerror(errno);
    f.close();
    std::error_code ec;
    fs::remove(path, ec);
    return fmt::format("cannot write '{}': {}", path.string(), why);
  }
  return "";
}

at::Tensor standalone(const at::Tensor& t) {
  if (!t.defined()) return t;
  if (!t.device().is_cpu()) return t.cpu();  // replayed on the CPU, and loadable without a GPU
  if (!t.has_storage()) return t;
  const size_t needed = static_cast<size_t>(t.numel()) * t.element_size();
  if (t.storage().nbytes() > needed || !t.is_contiguous()) return t.clone(at::MemoryFormat::Contiguous);
  return t;
}

c10::IValue standalone(const c10::IValue& v) {
  if (v.isTensor()) return standalone(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> list;
    const auto tensors = v.toTensorList();
    for (size_t i = 0; i < tensors.size(); ++i) list.push_back(standalone(tensors.get(i)));
    return list;
  }
  return v;
}

// The copies a dump makes are the sentinel's, not the model's: a profiler must not see them.
std::vector<char> pickle_tuple(const std::vector<c10::IValue>& values) {
  capture::NotRecorded not_recorded;
  std::vector<c10::IValue> elements;
  for (const auto& v : values) elements.push_back(standalone(v));
  return torch::jit::pickle_save(c10::ivalue::Tuple::create(std::move(elements)));
}

}  // namespace

std::vector<char> pickle_tensor(const at::Tensor& t) {
  capture::NotRecorded not_recorded;
  return torch::jit::pickle_save(standalone(t));
}

TensorDumper::TensorDumper(const DumpOptions& options, const std::string& log_dir)
    : options_(options), enabled_(options.enabled()) {
  dir_ = !options.dir().empty() ? options.dir() : (fs::path(log_dir.empty() ? "." : log_dir) / "saved_tensors").string();
  if (!enabled_) return;
  try {
    layers_ = std::regex(options.layers(), std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw OptionError(fmt::format("sentinel: save_tensor layers regex '{}' is invalid: {}", options.layers(), e.what()));
  }
}

bool TensorDumper::wants(int64_t step, const std::string& layer) {
  if (!enabled_ || step < options_.start_step()) return false;
  if (options_.end_step() >= 0 && step > options_.end_step()) return false;
  if ((step - options_.start_step()) % options_.freq() != 0) return false;
  auto it = selected_.find(layer);
  if (it == selected_.end()) it = selected_.emplace(layer, std::regex_match(layer, layers_)).first;
  return it->second;
}

void TensorDumper::save(const at::Tensor& t, const std::string& layer, const std::string& role, int64_t step,
                        std::ostream& out) {
  if (!enabled_ || !t.defined()) return;
  auto stop = [&](const std::string& why) {
    out << fmt::format("sentinel: tensor dumps stop: {}\n", why) << std::flush;
    enabled_ = false;
  };
  if (!dir_made_) {
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec || !fs::is_directory(dir_)) {
      stop(fmt::format("the directory '{}' cannot be created: {}", dir_, ec ? ec.message() : "not a directory"));
      return;
    }
    dir_made_ = true;
  }
  if (step != step_) {
    uses_.clear();
    step_ = step;
  }
  if (!t.device().is_cpu() && !t.device().is_cuda()) {
    out << fmt::format("sentinel: {} {} of step {} not saved: on {}\n", layer, role, step, t.device().str()) << std::flush;
    return;
  }
  std::vector<char> bytes;
  try {
    bytes = pickle_tensor(t.device().is_cpu() ? t : t.cpu());
  } catch (const std::exception& e) {
    out << fmt::format("sentinel: {} {} of step {} not saved: {}\n", layer, role, step, e.what()) << std::flush;
    return;
  }
  if (bytes_ + static_cast<int64_t>(bytes.size()) > options_.max_bytes()) {
    stop(fmt::format("{} bytes saved in {} files; the next ({} bytes) would pass max_bytes {}", bytes_, files_,
                     bytes.size(), options_.max_bytes()));
    return;
  }
  const std::string stem = fmt::format("{}.{}.step{}", layer.empty() ? "root" : layer, role, step);
  const int use = uses_[stem]++;
  const fs::path path = fs::path(dir_) / (use == 0 ? stem + ".pt" : fmt::format("{}.{}.pt", stem, use));
  const std::string error = write_file(path, bytes);
  if (!error.empty()) {
    stop(error);
    return;
  }
  bytes_ += static_cast<int64_t>(bytes.size());
  ++files_;
}

std::string save_op_dump(const std::string& dir, const OpDump& op, const std::vector<c10::IValue>& inputs,
                         const std::vector<c10::IValue>& outputs) {
  // Beside the report: its directory is not made again if it has gone (the report says so).
  std::error_code ec;
  fs::create_directory(dir, ec);
  if (ec) return fmt::format("cannot create '{}': {}", dir, ec.message());
  std::vector<char> in, outs;
  try {
    in = pickle_tuple(inputs);
    outs = pickle_tuple(outputs);
  } catch (const std::exception& e) {
    return fmt::format("the arguments of {} cannot be saved: {}", op.op, e.what());
  }
  nlohmann::json j = {{"op", op.op},         {"overload", op.overload}, {"module_path", op.module_path},
                      {"batch", op.batch},   {"in_place", op.in_place}, {"inputs", "inputs.pt"},
                      {"outputs", "outputs.pt"}};
  const std::string text = report::json_text(j, 2) + "\n";
  std::string error = write_file(fs::path(dir) / "inputs.pt", in);
  if (error.empty()) error = write_file(fs::path(dir) / "outputs.pt", outs);
  if (error.empty()) error = write_file(fs::path(dir) / "op.json", std::vector<char>(text.begin(), text.end()));
  return error;
}

}  // namespace dumps
}  // namespace sentinel
