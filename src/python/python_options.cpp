#include "python/python_options.h"

#include <pybind11/stl.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cctype>
#include <algorithm>
#include <string>
#include <vector>

#include <sentinel/errors.h>
#include <sentinel/ranks.h>

#include "options/option_table.h"
#include "options/words.h"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace py = pybind11;

// torch binds its c10d objects with c10::intrusive_ptr as the holder (torch/csrc/utils/pybind.h
// says so for torch's own modules): declared here too, a Store or ProcessGroup made in Python
// arrives as the object torch made, shared with it.
PYBIND11_DECLARE_HOLDER_TYPE(T, c10::intrusive_ptr<T>, true)

namespace sentinel {
namespace python {

namespace {

[[noreturn]] void type_error(const std::string& argument, const char* wanted, py::handle got) {
  throw py::type_error(fmt::format("overflow_sentinel: {} must be {}, not {}", argument, wanted,
                                   py::str(py::type::of(got).attr("__name__")).cast<std::string>()));
}

// Python's bool is an int: an int option refuses it, as it is almost always a mistake.
int64_t as_int(py::handle v, const std::string& argument) {
  if (!py::isinstance<py::int_>(v) || py::isinstance<py::bool_>(v)) type_error(argument, "an int", v);
  return v.cast<int64_t>();
}
double as_float(py::handle v, const std::string& argument) {
  if ((!py::isinstance<py::float_>(v) && !py::isinstance<py::int_>(v)) || py::isinstance<py::bool_>(v)) {
    type_error(argument, "a number", v);
  }
  return v.cast<double>();
}
bool as_bool(py::handle v, const std::string& argument) {
  if (!py::isinstance<py::bool_>(v)) type_error(argument, "True or False", v);
  return v.cast<bool>();
}
std::string as_str(py::handle v, const std::string& argument) {
  if (py::isinstance<py::str>(v)) return v.cast<std::string>();
  // A pathlib.Path, for the directories.
  if (py::hasattr(v, "__fspath__")) return py::str(v.attr("__fspath__")()).cast<std::string>();
  type_error(argument, "a str", v);
}
// A c10d object made in Python (torch.distributed's TCPStore, FileStore, HashStore, a process
// group): pybind11 finds its C++ type through the types torch registered, which it shares with
// this module when both were built with the same pybind11 internals and compiler ABI.
template <class T>
c10::intrusive_ptr<T> as_c10d(py::handle v, const std::string& argument, const char* wanted) {
  try {
    return v.cast<c10::intrusive_ptr<T>>();
  } catch (const py::cast_error&) {
    type_error(argument, wanted, v);
  }
}

// A Python object as the option tables read it: a wrong type is a TypeError naming the argument
// (`fp8['margin']`), a wrong value an OptionError (ValueError).
class PyValue : public options::Value {
 public:
  PyValue(py::object v, std::string where) : v_(std::move(v)), where_(std::move(where)) {}

  bool is_null() const override { return v_.is_none(); }
  bool is_boolean() const override { return py::isinstance<py::bool_>(v_); }
  bool boolean() const override { return as_bool(v_, where_); }
  int64_t integer() const override { return as_int(v_, where_); }
  double number() const override { return as_float(v_, where_); }
  std::string text() const override { return as_str(v_, where_); }

  std::vector<std::unique_ptr<options::Value>> items() const override {
    std::vector<std::unique_ptr<options::Value>> out;
    // A single str stands for a list of one (recipes="mxfp8").
    if (py::isinstance<py::str>(v_)) {
      out.push_back(std::make_unique<PyValue>(v_, where_));
      return out;
    }
    if (py::isinstance<py::dict>(v_) || !py::isinstance<py::iterable>(v_)) type_error(where_, "a list", v_);
    size_t i = 0;
    for (auto item : v_) {
      out.push_back(std::make_unique<PyValue>(py::reinterpret_borrow<py::object>(item), fmt::format("{}[{}]", where_, i++)));
    }
    return out;
  }

  std::vector<options::Entry> entries(const std::vector<std::string_view>& keys) const override {
    if (!py::isinstance<py::dict>(v_)) type_error(where_, "a dict", v_);
    std::vector<options::Entry> out;
    for (auto item : py::reinterpret_borrow<py::dict>(v_)) {
      if (!py::isinstance<py::str>(item.first)) type_error(where_ + " key", "a str", item.first);
      auto key = item.first.cast<std::string>();
      if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
        // The top level is the keyword arguments themselves.
        if (where_.empty()) throw py::type_error(fmt::format("overflow_sentinel: unexpected keyword argument '{}'", key));
        throw py::type_error(fmt::format("overflow_sentinel: {} has no key '{}' (it takes {})", where_, key,
                                         fmt::join(keys, ", ")));
      }
      const std::string where = where_.empty() ? key : fmt::format("{}['{}']", where_, key);
      out.push_back({std::move(key), std::make_unique<PyValue>(py::reinterpret_borrow<py::object>(item.second), where)});
    }
    return out;
  }

  size_t choice(const std::vector<std::string_view>& names) const override {
    const std::string name = as_str(v_, where_);
    const std::string lower = options::lower_case(name);
    for (size_t i = 0; i < names.size(); ++i) {
      if (lower == names[i]) return i;
    }
    throw OptionError(fmt::format("overflow_sentinel: {} '{}' is not one of '{}'", where_, name, fmt::join(names, "', '")));
  }

  std::shared_ptr<RankChannel> rank_channel(options::ChannelKind kind) const override {
    if (kind == options::ChannelKind::Store) return store_channel(as_c10d<c10d::Store>(v_, where_, "a torch.distributed Store"));
    return group_channel(as_c10d<c10d::ProcessGroup>(v_, where_, "a torch.distributed ProcessGroup"));
  }

  [[noreturn]] void fail(std::string_view message) const override {
    throw OptionError(fmt::format("overflow_sentinel: {}: {}", where_, message));
  }

 private:
  py::object v_;
  std::string where_;
};

}  // namespace

void apply_options(Options& options, const py::dict& kwargs) {
  options::apply(options, PyValue(kwargs, ""), options::option_fields());
}

std::vector<std::string> option_names() {
  std::vector<std::string> names;
  for (const auto& f : options::option_fields()) names.emplace_back(f.name);
  return names;
}

}  // namespace python
}  // namespace sentinel
