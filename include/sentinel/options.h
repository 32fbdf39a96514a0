#pragma once
// Options of the watchdog, in LibTorch's chained-setter style:
//   sentinel::Options().max_frames_to_save(50).trace_batch_nums({1, 3}).report_dir("out")
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <sentinel/fp8_types.h>
#include <string>
#include <utility>
#include <vector>

namespace sentinel {

struct Report;

// What happens when the first inf/nan is detected.
enum class Action {
  Throw,     // sentinel::NonFiniteError reaches the caller at the next safe point (default)
  Abort,     // print and write the report, then std::abort()
  Warn,      // print and write the report, keep running
  Callback,  // call the user's callback with the report, keep running
};

// Defines `Self& name(T)` (setter, chains) and `const T& name() const` (getter).
#define SENTINEL_OPTION_OF(Self, T, name, ...)        \
 public:                                              \
  Self& name(T value) {                               \
    name##_ = std::move(value);                       \
    return *this;                                     \
  }                                                   \
  const T& name() const noexcept { return name##_; }  \
                                                      \
 private:                                             \
  T name##_ = __VA_ARGS__
#define SENTINEL_OPTION(T, name, ...) SENTINEL_OPTION_OF(Options, T, name, __VA_ARGS__)

// FP8 numerics of GEMM inputs (linear, matmul, mm, addmm, bmm, baddbmm, convolutions): what
// delayed scaling (TransformerEngine's recipe) would do to each layer's activations, weights and
// gradients, step by step (a step is a batch). Read in the same pass as the frame statistics.
class Fp8Options {
  SENTINEL_OPTION_OF(Fp8Options, bool, enabled, false);
  SENTINEL_OPTION_OF(Fp8Options, fp8::Recipe, recipe, fp8::Recipe());
  // ECMAScript regex matched against the whole module path, like the layer selection of
  // TransformerEngine's debug tools. Default: every layer.
  SENTINEL_OPTION_OF(Fp8Options, std::string, layers, ".*");
  // Probe steps start_step, start_step + freq, ... up to end_step (-1: no end).
  SENTINEL_OPTION_OF(Fp8Options, int64_t, freq, 1);
  SENTINEL_OPTION_OF(Fp8Options, int64_t, start_step, 0);
  SENTINEL_OPTION_OF(Fp8Options, int64_t, end_step, -1);
  // Alarm when a slot's overflow fraction exceeds this (default 0.1% of its elements) ...
  SENTINEL_OPTION_OF(Fp8Options, double, overflow_alarm, 1e-3);
  // ... or its drift log2(delayed scale / current scale) exceeds this (default 0.5: the delayed
  // scale is over 41% larger than the current amax calls for, so values are about to overflow).
  SENTINEL_OPTION_OF(Fp8Options, double, drift_alarm, 0.5);
  SENTINEL_OPTION_OF(Fp8Options, Action, alarm_action, Action::Warn);
  // The recipes replayed on the same tensors, side by side: each gives its own metrics per slot
  // and step (Fp8SlotMetrics::recipe). Delayed scaling alone by default; `recipe()` sets its
  // history and margin, the format policy of delayed, current and mxfp8, and current's margin.
  SENTINEL_OPTION_OF(Fp8Options, std::vector<fp8::ScalingRecipe>, recipes, {fp8::ScalingRecipe::Delayed});
  // How MXFP8 picks a block's E8M0 exponent: TransformerEngine's (RoundUp, no element overflows)
  // by default, or the OCP MX v1.0 rule (OcpFloor, the top binade saturates).
  SENTINEL_OPTION_OF(Fp8Options, fp8::MxScaleRule, mx_scale_rule, fp8::MxScaleRule::RoundUp);
  // Float8Block (TransformerEngine's Float8BlockScaling): power-of-two scales, as TE's default
  // (false: FP32 scales, as NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1 gives), and the floor put under
  // each block's amax before its scale is taken (TE's amax_epsilon; default 0, >= 0).
  SENTINEL_OPTION_OF(Fp8Options, bool, block_scaling_pow2_scales, true);
  SENTINEL_OPTION_OF(Fp8Options, double, block_scaling_amax_epsilon, 0.0);
};

// "delayed", "current", "mxfp8", "nvfp4", "float8block" (also in capitals, and TE's
// "Float8BlockScaling"); throws sentinel::OptionError naming the accepted names for anything else.
fp8::ScalingRecipe parse_recipe(const std::string& name);
// A comma-separated list of them ("delayed,mxfp8"); duplicates and an empty list are errors.
std::vector<fp8::ScalingRecipe> parse_recipes(const std::string& list);

// The statistics menu of TransformerEngine's debug tools (collect_tensor_stats, and
// collect_fp8_tensor_stats for the last two), taken in the same read as the frame statistics.
enum class Stat : uint8_t {
  Min,           // smallest value (NaN if any element is NaN, as torch.min)
  Max,           // largest value (likewise)
  Mean,          // over every element: an inf or NaN makes it inf or NaN, as torch.mean
  Std,           // unbiased (n - 1), as torch.std
  L1Norm,        // sum |x|
  L2Norm,        // sqrt(sum x^2)
  CurAmax,       // max |x| of this step
  DynamicRange,  // log2(max |x| / smallest non-zero |x|); 0 when no element is non-zero
  Underflows,    // % of elements the FP8 cast under the slot's delayed scale flushes to zero
  Overflows,     // % of elements it saturates (both need the FP8 probe: Options::fp8)
  // TransformerEngine's max_blockwise_dynamic_range: the largest log2(amax / smallest non-zero
  // |x|) of a block (StatsCollection::blockwise_*), the max over the step's uses. A second read.
  MaxBlockwiseDynamicRange,
};
// The name used in configs and logs ("min", "l1_norm", "cur_amax", "underflows", ...).
const char* stat_name(Stat stat);
// The Stat of a name; false when there is none.
bool parse_stat(const std::string& name, Stat& stat);

// One collection of statistics: which layers' GEMM tensors, which statistics, which steps
// (a step is a batch). The watchdog aggregates every use of a (layer, tensor) slot within a step
// and hands one record per layer, tensor, statistic and step to the loggers.
class StatsCollection {
  // The section's name, shown in the debug log.
  SENTINEL_OPTION_OF(StatsCollection, std::string, name, "stats");
  // ECMAScript regex matched against the whole module path (a config's layer_numbers and
  // layer_types compile to one).
  SENTINEL_OPTION_OF(StatsCollection, std::string, layers, ".*");
  SENTINEL_OPTION_OF(StatsCollection, std::vector<Stat>, stats, {});
  SENTINEL_OPTION_OF(StatsCollection, std::vector<fp8::Role>, tensors,
                     {fp8::Role::Activation, fp8::Role::Gradient, fp8::Role::Weight});
  // Steps start_step, start_step + freq, ... up to end_step inclusive (-1: no end).
  SENTINEL_OPTION_OF(StatsCollection, int64_t, freq, 1);
  SENTINEL_OPTION_OF(StatsCollection, int64_t, start_step, 0);
  SENTINEL_OPTION_OF(StatsCollection, int64_t, end_step, -1);
  // Stat::MaxBlockwiseDynamicRange's blocks: `blockwise_block_size` consecutive elements of the
  // tensor's rows (dims 1) or block_size x block_size tiles (dims 2) of the tensor seen as
  // [numel / last dim, last dim]; with max_over_orientations, the columns' blocks count too.
  // TransformerEngine's defaults: 32, 1, false.
  SENTINEL_OPTION_OF(StatsCollection, int64_t, blockwise_block_size, 32);
  SENTINEL_OPTION_OF(StatsCollection, int64_t, blockwise_dims, 1);
  SENTINEL_OPTION_OF(StatsCollection, bool, blockwise_max_over_orientations, false);
  // Where it was configured ("config.yaml:12"), named in messages about it.
  SENTINEL_OPTION_OF(StatsCollection, std::string, source, {});
};

// Tensor dumps (Megatron's --save-tensor): files torch.load opens.
class DumpOptions {
  // The GEMM inputs, outputs, incoming gradients and weights of the selected layers, on the
  // selected steps, as <dir>/<layer>.<role>.step<N>.pt.
  SENTINEL_OPTION_OF(DumpOptions, bool, enabled, false);
  // Default: <log_dir>/saved_tensors, else ./saved_tensors.
  SENTINEL_OPTION_OF(DumpOptions, std::string, dir, {});
  SENTINEL_OPTION_OF(DumpOptions, std::string, layers, ".*");
  SENTINEL_OPTION_OF(DumpOptions, int64_t, freq, 1);
  SENTINEL_OPTION_OF(DumpOptions, int64_t, start_step, 0);
  SENTINEL_OPTION_OF(DumpOptions, int64_t, end_step, -1);
  // Dumps stop (said once) when they would pass this many bytes in all.
  SENTINEL_OPTION_OF(DumpOptions, int64_t, max_bytes, int64_t{1} << 30);
  // At detection, the op that made the inf/nan: its arguments and results go to
  // <report files>/dump/, which `sentinel replay` re-runs. Needs report_dir.
  SENTINEL_OPTION_OF(DumpOptions, bool, on_detection, true);
};

class StatsLogger;  // sentinel/loggers.h

// How the ranks talk (opaque): sentinel/ranks.h makes one from a c10d store or process group.
class RankChannel;

// Many processes (torchrun, c10d): each rank writes its reports into <report_dir>/rank<R>/, and
// the ranks exchange one small record at Watchdog::backward and at batch end, so that every rank's
// report names the first rank that saw an inf/nan (and stops the ranks that did not). Active when
// the world has more than one rank. See docs/ranks.md.
class RankOptions {
  // This process's rank and the number of ranks; -1: from the channel's process group, else from
  // torchrun's RANK and WORLD_SIZE, else 0 and 1.
  SENTINEL_OPTION_OF(RankOptions, int64_t, rank, -1);
  SENTINEL_OPTION_OF(RankOptions, int64_t, world_size, -1);
  // false: no exchange (each rank still reports on its own, under its own directory).
  SENTINEL_OPTION_OF(RankOptions, bool, exchange, true);
  // A rank that shows no sign of life (its heartbeat stops, as when its process died) for this
  // long is given up at an exchange and named as not answering.
  SENTINEL_OPTION_OF(RankOptions, double, timeout_seconds, 5.0);
  // A rank that is alive but has not reached the exchange (rank 0 writing a checkpoint, say), or
  // has not started, is waited for at most this long.
  SENTINEL_OPTION_OF(RankOptions, double, max_wait_seconds, 600.0);
  // Where the records go: sentinel::store_channel(store) or sentinel::group_channel(group).
  // Default: a client of the c10d store at MASTER_ADDR:MASTER_PORT (torchrun's, or rank 0's).
  SENTINEL_OPTION_OF(RankOptions, std::shared_ptr<RankChannel>, channel, nullptr);
};

class Options {
  // How many of the most recent frames a report shows (HF's default: 21). At least 1.
  SENTINEL_OPTION(int64_t, max_frames_to_save, 21);
  // Batches (0-indexed) printed frame by frame as they run; detection is off in them (as in HF).
  SENTINEL_OPTION(std::vector<int64_t>, trace_batch_nums, {});
  // After this batch finishes, sentinel::AbortAfterBatch is thrown.
  SENTINEL_OPTION(std::optional<int64_t>, abort_after_batch_num, std::nullopt);
  SENTINEL_OPTION(Action, action, Action::Throw);
  // Directory for report files (created if missing); empty: no files.
  SENTINEL_OPTION(std::string, report_dir, {});
  // Skip ops whose outputs only alias their inputs (views such as t, view, select): same values.
  SENTINEL_OPTION(bool, skip_view_ops, true);
  // Which non-finite values are errors. false (the place rule, docs/nonfinite.md): a value an op
  // makes is tolerated while only ops of its module and the modules inside it read it; it is an
  // error once it leaves (read elsewhere, returned, written into a tensor the module did not
  // make) or appears in a backward. true: every op's inf/nan is an error where it appears.
  SENTINEL_OPTION(bool, strict, false);
  // true: every op the model runs is a frame, in every batch (the C++ API, TorchScript, the CLI).
  // false, the boundary tier (Python's default, docs/python.md): no op is watched in an ordinary
  // batch; each module's forward is one frame, its outputs read as it returns, the gradients after
  // the backward, what the optimizer wrote after its step; the front end replays a failing batch
  // op by op to name the op. Traced batches, FP8 monitoring, statistics collections, headroom and
  // dumps watch op by op in the batches they select.
  SENTINEL_OPTION(bool, exact, true);
  // Values the place rule would stop that the model means, "MODULE_REGEX [OP [ARGUMENT [KINDS]]]"
  // (docs/nonfinite.md): met there, they are counted, not reported.
  SENTINEL_OPTION(std::vector<std::string>, allow_nonfinite, {});
  SENTINEL_OPTION(Fp8Options, fp8, Fp8Options());
  // Counts per entry of what casting to fp16/bf16 would overflow or flush (a second read of each
  // floating tensor); see Watchdog::headroom().
  SENTINEL_OPTION(bool, headroom, false);
  // CUDA tensors are read on their GPU, on their current stream, without waiting; the frames wait
  // (outside the ring of max_frames_to_save) until the numbers are read back: at each batch end
  // and whenever this many frames are waiting. The first non-finite frame is still found exactly.
  SENTINEL_OPTION(int64_t, device_readback_frames, 1024);
  // Read back after every op instead: stops at the op that made the inf/nan, at one host
  // synchronisation per op.
  SENTINEL_OPTION(bool, device_sync_each_op, false);
  // Large inputs of ops known to write only their results (a GEMM's weight) are read on a second
  // thread while the op runs; the op's end waits for them, so frames, detection and call stacks
  // are unchanged. false: every read on the op's own thread.
  SENTINEL_OPTION(bool, read_inputs_beside_ops, true);
  // Opt-in, for models whose parameters stay put (inference, serving): a parameter's numbers are
  // kept from one batch to the next and reused while its storage, data pointer and version
  // counter are unchanged, instead of reading it again. Not exact: a write LibTorch does not
  // count (through .data(), data_ptr(), from_blob memory written by other code) leaves the
  // version counter as it was, and that parameter's numbers would then be stale.
  SENTINEL_OPTION(bool, reuse_unchanged_parameter_reads, false);
  // false: CUDA tensors are skipped and labelled "not on cpu", as on a build without CUDA.
  SENTINEL_OPTION(bool, watch_cuda, true);
  // TorchScript fuses chains of elementwise ops into one kernel from a model's third call on,
  // and the ops inside it would have no frame. While a watchdog lives, TorchScript's fusers are
  // off (restored when the last watchdog goes) and the watched TorchScript model is compiled
  // again without fusion. true: fusion is kept; a fused group then shows as one frame named
  // "fused_<ops>" whose tensors are not read.
  SENTINEL_OPTION(bool, keep_torchscript_fusion, false);
  SENTINEL_OPTION(RankOptions, ranks, RankOptions());
  // Statistics of selected layers, step by step, to the loggers (docs/config.md).
  SENTINEL_OPTION(std::vector<StatsCollection>, stats_collections, {});
  // Where the loggers write: <log_dir>/debug_logs/, <log_dir>/debug_statistics_logs/ and
  // <log_dir>/tensorboard/. Empty: only the custom loggers get the statistics.
  SENTINEL_OPTION(std::string, log_dir, {});
  // The loggers that write under log_dir: any of "file", "jsonl", "tensorboard".
  SENTINEL_OPTION(std::vector<std::string>, loggers, {"file"});
  SENTINEL_OPTION(DumpOptions, dumps, DumpOptions());
  // Path of the config the options came from (from_yaml), named in the debug log, and what in it
  // is accepted but not applied (TransformerEngine features that change how it trains).
  SENTINEL_OPTION(std::string, config_path, {});
  SENTINEL_OPTION(std::vector<std::string>, config_notes, {});

 public:
  // A logger of the user's own, given every step's statistics records (sentinel/loggers.h).
  Options& add_logger(std::shared_ptr<StatsLogger> logger) {
    custom_loggers_.push_back(std::move(logger));
    return *this;
  }
  const std::vector<std::shared_ptr<StatsLogger>>& custom_loggers() const noexcept { return custom_loggers_; }

  // Options from a YAML config in the layout of TransformerEngine's debug tools, with the
  // watchdog's own options under the key `sentinel:` (docs/config.md). Throws
  // sentinel::OptionError naming the file, the line and what was expected. `start`: the options it
  // applies to (a front end's own defaults).
  static Options from_yaml(const std::string& path);
  static Options from_yaml(const std::string& path, const Options& start);
  // From the config named by $SENTINEL_CONFIG when it is set, else the defaults.
  static Options from_config();

  // Sets the callback and Action::Callback.
  Options& callback(std::function<void(const Report&)> fn) {
    callback_ = std::move(fn);
    action_ = Action::Callback;
    return *this;
  }
  const std::function<void(const Report&)>& callback() const noexcept { return callback_; }
  // Where text goes (trace lines, reports). Default: std::cout. The stream must outlive the watchdog.
  Options& output(std::ostream& os) {
    output_ = &os;
    return *this;
  }
  std::ostream& output() const;

  // Throws sentinel::OptionError naming the first invalid option.
  void validate() const;

 private:
  std::function<void(const Report&)> callback_;
  std::ostream* output_ = nullptr;
  std::vector<std::shared_ptr<StatsLogger>> custom_loggers_;
};

#undef SENTINEL_OPTION
#undef SENTINEL_OPTION_OF

}  // namespace sentinel
