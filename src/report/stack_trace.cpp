#define BOOST_STACKTRACE_USE_BACKTRACE
#include "report/stack_trace.h"

#include <torch/csrc/jit/frontend/source_range.h>
#include <torch/csrc/jit/runtime/interpreter.h>

#include <boost/stacktrace.hpp>

#include <atomic>

namespace sentinel {
namespace report {

namespace {

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// Frames that belong to the machinery between the user's call and the detection.
bool is_library_frame(const std::string& name) {
  if (name.empty()) return true;  // no symbol: a stripped library
  static const char* const kPrefixes[] = {"sentinel::", "at::", "c10::", "torch::", "std::", "boost::", "testing::",
                                          "void c10::", "void at::", "void torch::", "void std::", "__libc", "_start",
                                          "clone", "start_thread", "_Py", "Py", "pybind11::", "THP",
                                          "method_vectorcall", "cfunction_", "slot_tp_"};
  for (const char* p : kPrefixes) {
    if (starts_with(name, p)) return true;
  }
  // Dispatcher and kernel namespaces can follow a return type ("at::Tensor at::native::add(...)").
  // Argument types are not looked at: Net::forward(at::Tensor) is the user's code.
  const std::string qualified = name.substr(0, name.find('('));
  for (const char* ns : {"at::native::", "c10::impl::", "at::_ops::", "torch::autograd::", "torch::jit::"}) {
    if (qualified.find(ns) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

std::vector<std::string> user_call_stack(size_t max_lines) {
  std::vector<std::string> lines;
  size_t collapsed = 0;
  auto flush = [&] {
    if (collapsed > 0) lines.push_back("[... " + std::to_string(collapsed) + " library frames]");
    collapsed = 0;
  };
  for (const auto& frame : boost::stacktrace::stacktrace()) {
    const std::string name = frame.name();
    if (is_library_frame(name)) {
      ++collapsed;
      continue;
    }
    flush();
    std::string line = name;
    const std::string file = frame.source_file();
    if (!file.empty()) line += " at " + file + ":" + std::to_string(frame.source_line());
    lines.push_back(line);
    if (lines.size() >= max_lines) break;
  }
  flush();
  return lines;
}

namespace {
std::atomic<PythonStackSource> python_stack_source{nullptr};
}  // namespace

void set_python_stack_source(PythonStackSource source) { python_stack_source.store(source); }

std::vector<std::string> python_call_stack() {
  const PythonStackSource source = python_stack_source.load();
  return source ? source() : std::vector<std::string>();
}

std::vector<std::string> torchscript_call_stack() {
  std::vector<std::string> lines;
  const auto stack = torch::jit::currentCallstack();  // innermost first already
  for (auto it = stack.begin(); it != stack.end(); ++it) {
    std::string line = it->filename;
    const auto& range = it->range;
    if (auto loc = range.file_line_col()) {
      line = std::get<0>(*loc) + ":" + std::to_string(std::get<1>(*loc));
    }
    std::string code = range.text().str();
    const auto nl = code.find('\n');
    if (nl != std::string::npos) code = code.substr(0, nl);
    lines.push_back(line + ": " + code + "  (in " + it->filename + ")");
  }
  return lines;
}

}  // namespace report
}  // namespace sentinel
