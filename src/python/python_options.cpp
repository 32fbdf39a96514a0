#include "python/python_options.h"

#include <pybind11/stl.h>

#include <fmt/format.h>

#include <cctype>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <sentinel/errors.h>
#include <sentinel/ranks.h>

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
std::vector<int64_t> as_int_list(py::handle v, const std::string& argument) {
  if (py::isinstance<py::str>(v) || !py::isinstance<py::iterable>(v)) type_error(argument, "a list of ints", v);
  std::vector<int64_t> out;
  for (auto item : v) out.push_back(as_int(item, argument + " item"));
  return out;
}
std::vector<std::string> as_str_list(py::handle v, const std::string& argument) {
  if (py::isinstance<py::str>(v)) return {v.cast<std::string>()};
  if (!py::isinstance<py::iterable>(v)) type_error(argument, "a list of str", v);
  std::vector<std::string> out;
  for (auto item : v) out.push_back(as_str(item, argument + " item"));
  return out;
}
py::dict as_dict(py::handle v, const std::string& argument) {
  if (!py::isinstance<py::dict>(v)) type_error(argument, "a dict", v);
  return py::reinterpret_borrow<py::dict>(v);
}

template <typename Enum>
Enum parse_named(const std::string& name, const std::string& argument,
                 std::initializer_list<std::pair<const char*, Enum>> names) {
  std::string lower;
  for (char c : name) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::string accepted;
  for (const auto& [n, value] : names) {
    if (lower == n) return value;
    accepted += accepted.empty() ? std::string("'") + n + "'" : std::string(", '") + n + "'";
  }
  throw OptionError(fmt::format("overflow_sentinel: {} '{}' is not one of {}", argument, name, accepted));
}

// Applies a dict to a nested options object through a table of setters.
template <typename Target>
using Setters = std::map<std::string, std::function<void(Target&, py::handle, const std::string&)>>;

template <typename Target>
void apply_dict(Target& target, const py::dict& d, const Setters<Target>& setters, const std::string& argument) {
  for (auto item : d) {
    if (!py::isinstance<py::str>(item.first)) type_error(argument + " key", "a str", item.first);
    const auto key = item.first.cast<std::string>();
    auto it = setters.find(key);
    if (it == setters.end()) {
      std::string known;
      for (const auto& s : setters) known += (known.empty() ? "" : ", ") + s.first;
      throw py::type_error(fmt::format("overflow_sentinel: {} has no key '{}' (it takes {})", argument, key, known));
    }
    it->second(target, item.second, argument + "['" + key + "']");
  }
}

fp8::Recipe parse_fp8_recipe(py::handle v, const std::string& argument) {
  fp8::Recipe r;
  const Setters<fp8::Recipe> setters = {
      {"format", [](fp8::Recipe& t, py::handle x, const std::string& a) {
         t.format(parse_named<fp8::FormatPolicy>(as_str(x, a), a, {{"e4m3", fp8::FormatPolicy::E4M3},
                                                                    {"e5m2", fp8::FormatPolicy::E5M2},
                                                                    {"hybrid", fp8::FormatPolicy::HYBRID}}));
       }},
      {"amax_history_len", [](fp8::Recipe& t, py::handle x, const std::string& a) { t.amax_history_len(static_cast<int>(as_int(x, a))); }},
      {"amax_compute_algo", [](fp8::Recipe& t, py::handle x, const std::string& a) {
         t.amax_compute_algo(parse_named<fp8::AmaxAlgo>(as_str(x, a), a, {{"max", fp8::AmaxAlgo::Max},
                                                                          {"most_recent", fp8::AmaxAlgo::MostRecent}}));
       }},
      {"margin", [](fp8::Recipe& t, py::handle x, const std::string& a) { t.margin(static_cast<int>(as_int(x, a))); }},
  };
  apply_dict(r, as_dict(v, argument), setters, argument);
  return r;
}

Fp8Options parse_fp8(py::handle v, Fp8Options o, const std::string& argument) {
  const Setters<Fp8Options> setters = {
      {"enabled", [](Fp8Options& t, py::handle x, const std::string& a) { t.enabled(as_bool(x, a)); }},
      {"recipe", [](Fp8Options& t, py::handle x, const std::string& a) { t.recipe(parse_fp8_recipe(x, a)); }},
      {"layers", [](Fp8Options& t, py::handle x, const std::string& a) { t.layers(as_str(x, a)); }},
      {"freq", [](Fp8Options& t, py::handle x, const std::string& a) { t.freq(as_int(x, a)); }},
      {"start_step", [](Fp8Options& t, py::handle x, const std::string& a) { t.start_step(as_int(x, a)); }},
      {"end_step", [](Fp8Options& t, py::handle x, const std::string& a) { t.end_step(as_int(x, a)); }},
      {"overflow_alarm", [](Fp8Options& t, py::handle x, const std::string& a) { t.overflow_alarm(as_float(x, a)); }},
      {"drift_alarm", [](Fp8Options& t, py::handle x, const std::string& a) { t.drift_alarm(as_float(x, a)); }},
      {"alarm_action", [](Fp8Options& t, py::handle x, const std::string& a) { t.alarm_action(parse_action(as_str(x, a), a.c_str())); }},
      {"recipes", [](Fp8Options& t, py::handle x, const std::string& a) {
         std::vector<fp8::ScalingRecipe> recipes;
         for (const auto& name : as_str_list(x, a)) recipes.push_back(parse_recipe(name));
         t.recipes(recipes);
       }},
      {"mx_scale_rule", [](Fp8Options& t, py::handle x, const std::string& a) {
         t.mx_scale_rule(parse_named<fp8::MxScaleRule>(as_str(x, a), a, {{"round_up", fp8::MxScaleRule::RoundUp},
                                                                         {"ocp_floor", fp8::MxScaleRule::OcpFloor}}));
       }},
      {"block_scaling_pow2_scales", [](Fp8Options& t, py::handle x, const std::string& a) { t.block_scaling_pow2_scales(as_bool(x, a)); }},
      {"block_scaling_amax_epsilon", [](Fp8Options& t, py::handle x, const std::string& a) { t.block_scaling_amax_epsilon(as_float(x, a)); }},
  };
  // fp8=True: every layer with the defaults.
  if (py::isinstance<py::bool_>(v)) return o.enabled(v.cast<bool>());
  const py::dict d = as_dict(v, argument);
  if (!d.contains("enabled")) o.enabled(true);  // a dict of FP8 settings means FP8 is wanted
  apply_dict(o, d, setters, argument);
  return o;
}

DumpOptions parse_dumps(py::handle v, DumpOptions o, const std::string& argument) {
  const Setters<DumpOptions> setters = {
      {"enabled", [](DumpOptions& t, py::handle x, const std::string& a) { t.enabled(as_bool(x, a)); }},
      {"dir", [](DumpOptions& t, py::handle x, const std::string& a) { t.dir(as_str(x, a)); }},
      {"layers", [](DumpOptions& t, py::handle x, const std::string& a) { t.layers(as_str(x, a)); }},
      {"freq", [](DumpOptions& t, py::handle x, const std::string& a) { t.freq(as_int(x, a)); }},
      {"start_step", [](DumpOptions& t, py::handle x, const std::string& a) { t.start_step(as_int(x, a)); }},
      {"end_step", [](DumpOptions& t, py::handle x, const std::string& a) { t.end_step(as_int(x, a)); }},
      {"max_bytes", [](DumpOptions& t, py::handle x, const std::string& a) { t.max_bytes(as_int(x, a)); }},
      {"on_detection", [](DumpOptions& t, py::handle x, const std::string& a) { t.on_detection(as_bool(x, a)); }},
  };
  apply_dict(o, as_dict(v, argument), setters, argument);
  return o;
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

RankOptions parse_ranks(py::handle v, RankOptions o, const std::string& argument) {
  const Setters<RankOptions> setters = {
      {"rank", [](RankOptions& t, py::handle x, const std::string& a) { t.rank(as_int(x, a)); }},
      {"world_size", [](RankOptions& t, py::handle x, const std::string& a) { t.world_size(as_int(x, a)); }},
      {"exchange", [](RankOptions& t, py::handle x, const std::string& a) { t.exchange(as_bool(x, a)); }},
      {"timeout_seconds", [](RankOptions& t, py::handle x, const std::string& a) { t.timeout_seconds(as_float(x, a)); }},
      {"max_wait_seconds", [](RankOptions& t, py::handle x, const std::string& a) { t.max_wait_seconds(as_float(x, a)); }},
      {"store", [](RankOptions& t, py::handle x, const std::string& a) {
         t.channel(store_channel(as_c10d<c10d::Store>(x, a, "a torch.distributed Store")));
       }},
      {"group", [](RankOptions& t, py::handle x, const std::string& a) {
         t.channel(group_channel(as_c10d<c10d::ProcessGroup>(x, a, "a torch.distributed ProcessGroup")));
       }},
  };
  apply_dict(o, as_dict(v, argument), setters, argument);
  return o;
}

StatsCollection parse_collection(py::handle v, const std::string& argument) {
  StatsCollection c;
  const Setters<StatsCollection> setters = {
      {"name", [](StatsCollection& t, py::handle x, const std::string& a) { t.name(as_str(x, a)); }},
      {"layers", [](StatsCollection& t, py::handle x, const std::string& a) { t.layers(as_str(x, a)); }},
      {"stats", [](StatsCollection& t, py::handle x, const std::string& a) {
         std::vector<Stat> stats;
         for (const auto& name : as_str_list(x, a)) {
           Stat s;
           if (!parse_stat(name, s)) throw OptionError(fmt::format("overflow_sentinel: {}: '{}' is not a statistic", a, name));
           stats.push_back(s);
         }
         t.stats(stats);
       }},
      {"tensors", [](StatsCollection& t, py::handle x, const std::string& a) {
         std::vector<fp8::Role> roles;
         for (const auto& name : as_str_list(x, a)) {
           roles.push_back(parse_named<fp8::Role>(name, a, {{"activation", fp8::Role::Activation},
                                                            {"weight", fp8::Role::Weight},
                                                            {"gradient", fp8::Role::Gradient}}));
         }
         t.tensors(roles);
       }},
      {"freq", [](StatsCollection& t, py::handle x, const std::string& a) { t.freq(as_int(x, a)); }},
      {"start_step", [](StatsCollection& t, py::handle x, const std::string& a) { t.start_step(as_int(x, a)); }},
      {"end_step", [](StatsCollection& t, py::handle x, const std::string& a) { t.end_step(as_int(x, a)); }},
      {"blockwise_block_size", [](StatsCollection& t, py::handle x, const std::string& a) { t.blockwise_block_size(as_int(x, a)); }},
      {"blockwise_dims", [](StatsCollection& t, py::handle x, const std::string& a) { t.blockwise_dims(as_int(x, a)); }},
      {"blockwise_max_over_orientations", [](StatsCollection& t, py::handle x, const std::string& a) {
         t.blockwise_max_over_orientations(as_bool(x, a));
       }},
  };
  apply_dict(c, as_dict(v, argument), setters, argument);
  return c;
}

const Setters<Options>& top_level() {
  static const Setters<Options> setters = {
      {"max_frames_to_save", [](Options& t, py::handle x, const std::string& a) { t.max_frames_to_save(as_int(x, a)); }},
      {"trace_batch_nums", [](Options& t, py::handle x, const std::string& a) { t.trace_batch_nums(as_int_list(x, a)); }},
      {"abort_after_batch_num", [](Options& t, py::handle x, const std::string& a) {
         t.abort_after_batch_num(x.is_none() ? std::nullopt : std::optional<int64_t>(as_int(x, a)));
       }},
      {"action", [](Options& t, py::handle x, const std::string& a) { t.action(parse_action(as_str(x, a), a.c_str())); }},
      {"report_dir", [](Options& t, py::handle x, const std::string& a) { t.report_dir(x.is_none() ? "" : as_str(x, a)); }},
      {"skip_view_ops", [](Options& t, py::handle x, const std::string& a) { t.skip_view_ops(as_bool(x, a)); }},
      {"fp8", [](Options& t, py::handle x, const std::string& a) { t.fp8(parse_fp8(x, t.fp8(), a)); }},
      {"headroom", [](Options& t, py::handle x, const std::string& a) { t.headroom(as_bool(x, a)); }},
      {"device_readback_frames", [](Options& t, py::handle x, const std::string& a) { t.device_readback_frames(as_int(x, a)); }},
      {"device_sync_each_op", [](Options& t, py::handle x, const std::string& a) { t.device_sync_each_op(as_bool(x, a)); }},
      {"read_inputs_beside_ops", [](Options& t, py::handle x, const std::string& a) { t.read_inputs_beside_ops(as_bool(x, a)); }},
      {"reuse_unchanged_parameter_reads", [](Options& t, py::handle x, const std::string& a) { t.reuse_unchanged_parameter_reads(as_bool(x, a)); }},
      {"watch_cuda", [](Options& t, py::handle x, const std::string& a) { t.watch_cuda(as_bool(x, a)); }},
      {"keep_torchscript_fusion", [](Options& t, py::handle x, const std::string& a) { t.keep_torchscript_fusion(as_bool(x, a)); }},
      {"ranks", [](Options& t, py::handle x, const std::string& a) { t.ranks(parse_ranks(x, t.ranks(), a)); }},
      {"stats_collections", [](Options& t, py::handle x, const std::string& a) {
         if (py::isinstance<py::dict>(x) || !py::isinstance<py::iterable>(x)) type_error(a, "a list of dicts", x);
         std::vector<StatsCollection> collections;
         int i = 0;
         for (auto item : x) collections.push_back(parse_collection(item, a + "[" + std::to_string(i++) + "]"));
         t.stats_collections(collections);
       }},
      {"log_dir", [](Options& t, py::handle x, const std::string& a) { t.log_dir(x.is_none() ? "" : as_str(x, a)); }},
      {"loggers", [](Options& t, py::handle x, const std::string& a) { t.loggers(as_str_list(x, a)); }},
      {"dumps", [](Options& t, py::handle x, const std::string& a) { t.dumps(parse_dumps(x, t.dumps(), a)); }},
  };
  return setters;
}

}  // namespace

Action parse_action(const std::string& name, const char* argument) {
  return parse_named<Action>(name, argument, {{"throw", Action::Throw}, {"raise", Action::Throw},
                                              {"abort", Action::Abort}, {"warn", Action::Warn},
                                              {"callback", Action::Callback}});
}

void apply_options(Options& options, const py::dict& kwargs) {
  const auto& setters = top_level();
  for (auto item : kwargs) {
    const auto key = item.first.cast<std::string>();
    auto it = setters.find(key);
    if (it == setters.end()) {
      throw py::type_error(fmt::format("overflow_sentinel: unexpected keyword argument '{}'", key));
    }
    it->second(options, item.second, key);
  }
}

std::vector<std::string> option_names() {
  std::vector<std::string> names;
  for (const auto& s : top_level()) names.push_back(s.first);
  return names;
}

}  // namespace python
}  // namespace sentinel
