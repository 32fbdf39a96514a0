#include "options/option_table.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sentinel/ranks.h>

#include <algorithm>
#include <climits>

#include "options/spellings.h"

namespace sentinel::options {

std::shared_ptr<RankChannel> Value::rank_channel(ChannelKind kind) const {
  fail(fmt::format("a torch.distributed {} is given from Python (ranks={{\"{}\": ...}})",
                   kind == ChannelKind::Store ? "Store" : "process group", kind == ChannelKind::Store ? "store" : "group"));
  return nullptr;  // not reached: fail() throws
}

namespace {

// The items of a list, each named by its index for validation's messages.
template <class Read>
auto list_of(const Value& v, Read read) {
  std::vector<decltype(read(v))> out;
  auto items = v.items();
  for (size_t i = 0; i < items.size(); ++i) {
    items[i]->set_path(fmt::format("{}[{}]", v.path(), i));
    out.push_back(read(*items[i]));
  }
  return out;
}

// An int of the recipe: what does not fit is refused here, before it could wrap.
int int32(const Value& v) {
  const int64_t x = v.integer();
  if (x > INT_MAX) v.fail(fmt::format("must be at most {}, got {}", INT_MAX, x));
  if (x < INT_MIN) v.fail(fmt::format("must be at least {}, got {}", INT_MIN, x));
  return static_cast<int>(x);
}

std::string path_or_none(const Value& v) { return v.is_null() ? std::string() : v.text(); }

template <class E, size_t N>
std::string one_of(const Spelling<E> (&spellings)[N]) {
  return "one of " + all_names(spellings);
}
template <class E, size_t N>
std::string list_of_names(const Spelling<E> (&spellings)[N]) {
  return "a list of " + all_names(spellings);
}

const std::string kInt = "an int", kBool = "true or false", kNumber = "a number", kPath = "a path, or none",
                  kRegex = "a regex (whole module path)";

// The fields a step schedule shares (fp8, dumps, statistics).
template <class T>
void add_schedule(Table<T>& table) {
  table.push_back({"freq", kInt, "1", "every freq-th step (a step is a batch)", [](T& t, const Value& v) { t.freq(v.integer()); }});
  table.push_back({"start_step", kInt, "0", "the first step", [](T& t, const Value& v) { t.start_step(v.integer()); }});
  table.push_back({"end_step", kInt, "-1", "the last step (-1: no end)", [](T& t, const Value& v) { t.end_step(v.integer()); }});
}

}  // namespace

template <class Target>
void apply(Target& target, const Value& value, const Table<Target>& fields) {
  std::vector<std::string_view> keys;
  for (const auto& f : fields) {
    keys.push_back(f.name);
    keys.insert(keys.end(), f.aliases.begin(), f.aliases.end());
  }
  for (const Entry& e : value.entries(keys)) {
    for (const auto& f : fields) {
      if (f.name != e.key && std::find(f.aliases.begin(), f.aliases.end(), e.key) == f.aliases.end()) continue;
      e.value->set_path(value.path().empty() ? std::string(f.name) : fmt::format("{}.{}", value.path(), f.name));
      f.set(target, *e.value);
      break;
    }
  }
}
template void apply(Options&, const Value&, const Table<Options>&);
template void apply(Fp8Options&, const Value&, const Table<Fp8Options>&);
template void apply(fp8::Recipe&, const Value&, const Table<fp8::Recipe>&);
template void apply(RankOptions&, const Value&, const Table<RankOptions>&);
template void apply(DumpOptions&, const Value&, const Table<DumpOptions>&);
template void apply(StatsCollection&, const Value&, const Table<StatsCollection>&);

const Table<fp8::Recipe>& recipe_fields() {
  using R = fp8::Recipe;
  static const Table<R> table = {
      {"format", one_of(kFormats), "hybrid", "the FP8 format: E4M3 forward and E5M2 backward (hybrid), or one for both",
       [](R& r, const Value& v) { r.format(choose(v, kFormats)); }, {"fp8_format"}},
      {"margin", kInt, "0", "the delayed scale's margin: scale = (FP8 max / amax) / 2^margin",
       [](R& r, const Value& v) { r.margin(int32(v)); }},
      {"amax_history_len", kInt, "1024", "how many steps of amax the delayed scale remembers (at least 1)",
       [](R& r, const Value& v) { r.amax_history_len(int32(v)); }},
      {"amax_compute_algo", one_of(kAmaxAlgos), "max", "the amax the delayed scale is taken from: the history's largest, or the last",
       [](R& r, const Value& v) { r.amax_compute_algo(choose(v, kAmaxAlgos)); }},
  };
  return table;
}

const Table<Fp8Options>& fp8_fields() {
  using F = Fp8Options;
  static const Table<F> table = [] {
    Table<F> t = {
        {"enabled", kBool, "false (true when fp8 is given a mapping)", "read the GEMM inputs as the FP8 recipes would cast them",
         [](F& f, const Value& v) { f.enabled(v.boolean()); }},
    };
    // The delayed recipe's fields, at the section's own level (as in TransformerEngine's recipe).
    for (const auto& rf : recipe_fields()) {
      t.push_back({rf.name, rf.takes, rf.default_text, rf.help,
                   [set = rf.set](F& f, const Value& v) {
                     fp8::Recipe r = f.recipe();
                     set(r, v);
                     f.recipe(r);
                   },
                   rf.aliases});
    }
    t.push_back({"recipe", "a mapping of format, margin, amax_history_len, amax_compute_algo", "",
                 "the same four fields, as one mapping", [](F& f, const Value& v) {
                   fp8::Recipe r = f.recipe();
                   apply(r, v, recipe_fields());
                   f.recipe(r);
                 }});
    t.push_back({"layers", kRegex, ".*", "the layers whose GEMMs are read", [](F& f, const Value& v) { f.layers(v.layers()); }});
    add_schedule(t);
    t.push_back({"overflow_alarm", kNumber, "0.001", "alarm when a slot's overflow fraction exceeds this (>= 0)",
                 [](F& f, const Value& v) { f.overflow_alarm(v.number()); }});
    t.push_back({"drift_alarm", kNumber, "0.5", "alarm when log2(delayed scale / current scale) exceeds this",
                 [](F& f, const Value& v) { f.drift_alarm(v.number()); }});
    t.push_back({"alarm_action", one_of(kActions), "warn", "what an alarm does",
                 [](F& f, const Value& v) { f.alarm_action(choose(v, kActions)); }});
    t.push_back({"recipes", list_of_names(kRecipes), "[delayed]", "the recipes replayed side by side, each once",
                 [](F& f, const Value& v) {
                   f.recipes(list_of(v, [](const Value& item) { return choose(item, kRecipes); }));
                 }});
    t.push_back({"mx_scale_rule", one_of(kMxScaleRules), "round_up",
                 "MXFP8's block exponent: TransformerEngine's (no element overflows) or OCP MX v1.0's floor",
                 [](F& f, const Value& v) { f.mx_scale_rule(choose(v, kMxScaleRules)); }});
    t.push_back({"block_scaling_pow2_scales", kBool, "true", "Float8Block's scales are powers of two (TransformerEngine's default)",
                 [](F& f, const Value& v) { f.block_scaling_pow2_scales(v.boolean()); }});
    t.push_back({"block_scaling_amax_epsilon", kNumber, "0", "the floor under a Float8Block block's amax (>= 0)",
                 [](F& f, const Value& v) { f.block_scaling_amax_epsilon(v.number()); }});
    return t;
  }();
  return table;
}

const Table<RankOptions>& rank_fields() {
  using K = RankOptions;
  static const Table<K> table = {
      {"rank", kInt, "-1", "this process's rank (-1: the process group's, else $RANK, else 0)",
       [](K& k, const Value& v) { k.rank(v.integer()); }},
      {"world_size", kInt, "-1", "the number of ranks (-1: the process group's, else $WORLD_SIZE, else 1)",
       [](K& k, const Value& v) { k.world_size(v.integer()); }},
      {"exchange", kBool, "true", "the ranks tell each other what they saw, and stop together",
       [](K& k, const Value& v) { k.exchange(v.boolean()); }},
      {"timeout_seconds", kNumber, "5", "a rank silent this long (its heartbeat stopped) is given up",
       [](K& k, const Value& v) { k.timeout_seconds(v.number()); }},
      {"max_wait_seconds", kNumber, "600", "how long a live rank that has not reached the exchange is waited for",
       [](K& k, const Value& v) { k.max_wait_seconds(v.number()); }},
      {"store", "a torch.distributed Store (Python)", "MASTER_ADDR:MASTER_PORT's", "the store the ranks exchange through",
       [](K& k, const Value& v) { k.channel(v.rank_channel(ChannelKind::Store)); }},
      {"group", "a torch.distributed process group (Python)", "", "the process group the ranks exchange through",
       [](K& k, const Value& v) { k.channel(v.rank_channel(ChannelKind::Group)); }},
  };
  return table;
}

const Table<DumpOptions>& dump_fields() {
  using D = DumpOptions;
  static const Table<D> table = [] {
    Table<D> t = {
        {"enabled", kBool, "false", "save the selected layers' GEMM tensors as <dir>/<layer>.<role>.step<N>.pt",
         [](D& d, const Value& v) { d.enabled(v.boolean()); }},
        {"dir", kPath, "<log_dir>/saved_tensors", "where they go", [](D& d, const Value& v) { d.dir(path_or_none(v)); }},
        {"layers", kRegex, ".*", "the layers saved", [](D& d, const Value& v) { d.layers(v.layers()); }},
    };
    add_schedule(t);
    t.push_back({"max_bytes", kInt, "1073741824", "dumps stop (said once) before they pass this many bytes (>= 0)",
                 [](D& d, const Value& v) { d.max_bytes(v.integer()); }});
    t.push_back({"on_detection", kBool, "true", "at detection, the op that made the inf/nan is saved for `sentinel replay`",
                 [](D& d, const Value& v) { d.on_detection(v.boolean()); }});
    return t;
  }();
  return table;
}

const Table<StatsCollection>& collection_fields() {
  using C = StatsCollection;
  static const Table<C> table = [] {
    Table<C> t = {
        {"name", "a str", "stats", "the collection's name in the logs", [](C& c, const Value& v) { c.name(v.text()); }},
        {"layers", kRegex, ".*", "the layers whose GEMM tensors are read", [](C& c, const Value& v) { c.layers(v.layers()); }},
        {"stats", list_of_names(kStats), "[]", "the statistics",
         [](C& c, const Value& v) { c.stats(list_of(v, [](const Value& item) { return choose(item, kStats); })); }},
        {"tensors", list_of_names(kRoles), "[activation, gradient, weight]", "the GEMM tensors",
         [](C& c, const Value& v) { c.tensors(list_of(v, [](const Value& item) { return choose(item, kRoles); })); }},
    };
    add_schedule(t);
    t.push_back({"blockwise_block_size", kInt, "32", "max_blockwise_dynamic_range's block length (or tile side)",
                 [](C& c, const Value& v) { c.blockwise_block_size(v.integer()); }});
    t.push_back({"blockwise_dims", kInt, "1", "1: blocks of a row; 2: square tiles",
                 [](C& c, const Value& v) { c.blockwise_dims(v.integer()); }});
    t.push_back({"blockwise_max_over_orientations", kBool, "false", "the columns' blocks count too",
                 [](C& c, const Value& v) { c.blockwise_max_over_orientations(v.boolean()); }});
    return t;
  }();
  return table;
}

const Table<Options>& option_fields() {
  using O = Options;
  static const Table<O> table = {
      {"max_frames_to_save", kInt, "21", "the frames a report shows (HF's max_frames_to_save; 1 to 1000000)",
       [](O& o, const Value& v) { o.max_frames_to_save(v.integer()); }},
      {"trace_batch_nums", "a list of ints", "[]", "batches (0-indexed) printed frame by frame as they run; no detection in them",
       [](O& o, const Value& v) { o.trace_batch_nums(list_of(v, [](const Value& item) { return item.integer(); })); }},
      {"abort_after_batch_num", "an int, or none", "none", "stop after this batch (sentinel::AbortAfterBatch)",
       [](O& o, const Value& v) {
         o.abort_after_batch_num(v.is_null() ? std::nullopt : std::optional<int64_t>(v.integer()));
       }},
      {"action", one_of(kActions), "throw", "what a detection does (callback: C++ and Python only)",
       [](O& o, const Value& v) { o.action(choose(v, kActions)); }},
      {"report_dir", kPath, "none", "where the report files go (.txt, .json; .html from Python)",
       [](O& o, const Value& v) { o.report_dir(path_or_none(v)); }},
      {"skip_view_ops", kBool, "true", "no frames for ops whose outputs only alias their inputs (view, t, select)",
       [](O& o, const Value& v) { o.skip_view_ops(v.boolean()); }},
      {"strict", kBool, "false",
       "every op's inf/nan is an error, even one that never leaves its module (docs/nonfinite.md)",
       [](O& o, const Value& v) { o.strict(v.boolean()); }},
      {"exact", kBool, "true",
       "every op a frame in every batch; false (Python's default, Python only): module boundaries, and a replay at an inf/nan names the op",
       [](O& o, const Value& v) { o.exact(v.boolean()); }},
      {"allow_nonfinite", "a list of \"MODULE_REGEX [OP [ARGUMENT [KINDS]]]\"", "[]",
       "values the place rule would stop that the model means: counted, not reported (docs/nonfinite.md)",
       [](O& o, const Value& v) { o.allow_nonfinite(list_of(v, [](const Value& item) { return item.text(); })); }},
      {"fp8", "true or false, or a mapping of the fp8 fields", "false", "the FP8 probe (docs/fp8.md)",
       [](O& o, const Value& v) {
         Fp8Options f = o.fp8();
         if (v.is_boolean()) {
           f.enabled(v.boolean());
         } else {
           f.enabled(true);  // a mapping of FP8 settings means FP8 is wanted, unless it says otherwise
           apply(f, v, fp8_fields());
         }
         o.fp8(f);
       }},
      {"headroom", kBool, "false", "count what casting to fp16/bf16 would overflow or flush",
       [](O& o, const Value& v) { o.headroom(v.boolean()); }},
      {"device_readback_frames", kInt, "1024", "CUDA frames waiting to be read back at most (1 to 1000000)",
       [](O& o, const Value& v) { o.device_readback_frames(v.integer()); }},
      {"device_sync_each_op", kBool, "false", "read CUDA numbers back after every op (stops at the op itself)",
       [](O& o, const Value& v) { o.device_sync_each_op(v.boolean()); }},
      {"read_inputs_beside_ops", kBool, "true", "large inputs of ops that only write their results are read on a second thread",
       [](O& o, const Value& v) { o.read_inputs_beside_ops(v.boolean()); }},
      {"reuse_unchanged_parameter_reads", kBool, "false", "keep a parameter's numbers while its version is unchanged (not exact)",
       [](O& o, const Value& v) { o.reuse_unchanged_parameter_reads(v.boolean()); }},
      {"watch_cuda", kBool, "true", "false: CUDA tensors are skipped and labelled",
       [](O& o, const Value& v) { o.watch_cuda(v.boolean()); }},
      {"keep_torchscript_fusion", kBool, "false", "keep TorchScript's fusers on (a fused group is one unread frame)",
       [](O& o, const Value& v) { o.keep_torchscript_fusion(v.boolean()); }},
      {"ranks", "a mapping of the ranks fields", "", "many processes (docs/ranks.md)",
       [](O& o, const Value& v) {
         RankOptions r = o.ranks();
         apply(r, v, rank_fields());
         o.ranks(r);
       }},
      {"stats_collections", "a list of mappings of the stats_collections fields", "[]",
       "statistics of selected layers, step by step, to the loggers (docs/config.md)",
       [](O& o, const Value& v) {
         o.stats_collections(list_of(v, [](const Value& item) {
           StatsCollection c;
           apply(c, item, collection_fields());
           return c;
         }));
       }},
      {"log_dir", kPath, "none", "where the loggers write (debug_logs/, debug_statistics_logs/, tensorboard/)",
       [](O& o, const Value& v) { o.log_dir(path_or_none(v)); }},
      {"loggers", "a list of " + fmt::format("{}", fmt::join(kLoggers, ", ")), "[file]", "the loggers that write under log_dir, each once",
       [](O& o, const Value& v) {
         std::vector<std::string_view> names(std::begin(kLoggers), std::end(kLoggers));
         o.loggers(list_of(v, [&](const Value& item) { return std::string(names[item.choice(names)]); }));
       }},
      {"dumps", "a mapping of the dumps fields", "", "tensor dumps (Megatron's --save-tensor)",
       [](O& o, const Value& v) {
         DumpOptions d = o.dumps();
         apply(d, v, dump_fields());
         o.dumps(d);
       },
       {"save_tensor"}},
  };
  return table;
}

}  // namespace sentinel::options
