#include "cli/replay_command.h"

#include <sentinel/errors.h>
#include <sentinel/stats.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <ostream>

#include "cli/run_command.h"
#include "stats/tensor_stats.h"

namespace sentinel {
namespace cli {

namespace fs = std::filesystem;

namespace {

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

std::vector<char> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("cannot open '{}'", path.string()));
  return std::vector<char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::vector<c10::IValue> load_tuple(const fs::path& path) {
  c10::IValue v;
  try {
    v = torch::jit::pickle_load(read_bytes(path));
  } catch (const c10::Error& e) {
    throw InputError(fmt::format("'{}' is not a saved tuple of values: {}", path.string(),
                                 first_line(e.what_without_backtrace())));
  }
  if (!v.isTuple()) throw InputError(fmt::format("'{}' holds a {}, expected a tuple", path.string(), v.tagKind()));
  const auto& elements = v.toTupleRef().elements();
  return std::vector<c10::IValue>(elements.begin(), elements.end());
}

// "float32[4, 8] finite, abs max 3.2e+38" / "... 2 inf, 0 nan".
std::string describe(const at::Tensor& t) {
  TensorStats s;
  const auto r = stats::compute(t, s);
  const std::string shape = fmt::format("{}[{}]", stats::dtype_name(t.scalar_type()), fmt::join(t.sizes(), ", "));
  if (r != stats::Readability::Read) return fmt::format("{} ({})", shape, stats::describe(r));
  if (s.finite()) return fmt::format("{} finite, abs max {:.3e}", shape, s.abs_max);
  return fmt::format("{} {} nan, {} +inf, {} -inf of {}", shape, s.nan, s.pos_inf, s.neg_inf, s.count);
}

// Every tensor in a value (a tensor, or a list of them); whether all are finite.
bool show_values(const c10::IValue& v, const std::string& name, std::ostream& out, bool show) {
  bool finite = true;
  auto one = [&](const at::Tensor& t, const std::string& label) {
    TensorStats s;
    if (t.defined() && stats::compute(t, s) == stats::Readability::Read) finite = finite && s.finite();
    if (show) out << fmt::format("  {}: {}\n", label, t.defined() ? describe(t) : "None");
  };
  if (v.isTensor()) {
    one(v.toTensor(), name);
  } else if (v.isTensorList()) {
    const auto list = v.toTensorList();
    for (size_t i = 0; i < list.size(); ++i) one(list.get(i), fmt::format("{}[{}]", name, i));
  }
  return finite;
}

}  // namespace

int replay_dump(const std::string& dir, std::ostream& out) {
  const fs::path root(dir);
  if (!fs::is_directory(root)) throw InputError(fmt::format("'{}' is not a dump directory", dir));
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(read_bytes(root / "op.json"));
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("'{}' is not valid JSON: {}", (root / "op.json").string(), e.what()));
  }
  if (!meta.is_object() || !meta.contains("op") || !meta["op"].is_string()) {
    throw InputError(fmt::format("'{}' names no op", (root / "op.json").string()));
  }
  const std::string op = meta["op"].get<std::string>();
  const std::string overload = meta.value("overload", std::string());
  const std::string full = overload.empty() ? op : op + "." + overload;
  auto handle = c10::Dispatcher::singleton().findSchema({op, overload});
  if (!handle) throw InputError(fmt::format("'{}' names {}, which this LibTorch does not have", dir, full));
  std::vector<c10::IValue> inputs = load_tuple(root / meta.value("inputs", std::string("inputs.pt")));
  std::vector<c10::IValue> saved = load_tuple(root / meta.value("outputs", std::string("outputs.pt")));
  const auto& args = handle->schema().arguments();
  if (inputs.size() != args.size()) {
    throw InputError(fmt::format("'{}' holds {} arguments; {} takes {}", dir, inputs.size(), full, args.size()));
  }

  out << fmt::format("sentinel replay: {} of {} (batch {}), on the CPU\n", full,
                     meta.value("module_path", std::string()).empty() ? "the model" : meta.value("module_path", std::string()),
                     meta.value("batch", int64_t{0}));
  if (meta.value("in_place", false)) {
    out << "  the op writes its arguments: they are saved as it left them, so the replay starts from its result\n";
  }
  bool inputs_finite = true;
  for (size_t i = 0; i < inputs.size(); ++i) inputs_finite = show_values(inputs[i], "argument " + args[i].name(), out, true) && inputs_finite;

  std::vector<c10::IValue> stack = inputs;
  try {
    handle->callBoxed(stack);
  } catch (const c10::Error& e) {
    throw InputError(fmt::format("{} failed on the saved arguments: {}", full, first_line(e.what_without_backtrace())));
  }
  bool outputs_finite = true;
  for (size_t i = 0; i < stack.size(); ++i) outputs_finite = show_values(stack[i], fmt::format("result {}", i), out, true) && outputs_finite;
  bool saved_finite = true;
  for (const auto& v : saved) saved_finite = show_values(v, "", out, false) && saved_finite;

  if (outputs_finite) {
    out << fmt::format("not reproduced: {} gives finite results on the saved arguments{}\n", full,
                       saved_finite ? "" : " (the run's results held inf/nan)");
    return kClean;
  }
  out << (inputs_finite ? fmt::format("reproduced: {} makes inf/nan from finite arguments\n", full)
                        : fmt::format("reproduced: {} gives inf/nan; its arguments already held inf/nan\n", full));
  return kNonFinite;
}

}  // namespace cli
}  // namespace sentinel
