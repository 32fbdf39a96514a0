#pragma once
// A trip is data: the report is a plain value; renderers turn it into text or JSON.
#include <sentinel/stats.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace sentinel {

enum class EntryKind {
  Tensor,      // statistics computed
  None,        // an absent optional tensor
  NotATensor,  // a non-tensor value (HF: "not a tensor")
  Skipped,     // a tensor the sentinel does not read; `skip_reason` says why
};

// What a tensor is to its frame's op. Carried as data, never read back from the label (a
// parameter may be called `input_proj`).
enum class EntryRole {
  Parameter,  // a parameter the op used ("weight")
  Input,      // an argument (backward frames: an incoming gradient)
  Output,     // a result (backward frames: a gradient the node passes on)
  Gradient,   // a parameter's gradient (AccumulateGrad frames: "weight.grad")
};

struct Entry {
  std::string label;        // "weight", "input[0]", "output", "output[1][0]"
  EntryRole role = EntryRole::Input;
  EntryKind kind = EntryKind::Tensor;
  std::string dtype;        // "float32", ... (tensors only)
  std::string skip_reason;  // "empty", "sparse", "meta", "not on cpu", "complex", ...
  bool is_output = false;   // made by the op (outputs; for AccumulateGrad, the gradients)
  bool has_headroom = false;  // Options::headroom: counts below are filled in
  HeadroomCounts headroom;
  TensorStats stats;
};

enum class Direction { Forward, Backward };

// How a frame's module path was found.
enum class Attribution {
  ModuleHierarchy,  // TorchScript's module call stack
  Parameter,        // the op used a parameter owned by that module
  UserScope,        // a sentinel::scope (or RECORD_USER_SCOPE) around the op
  ModelRoot,        // nothing more precise: the watched model itself
};

struct Frame {
  int64_t batch_number = 0;
  int64_t op_index = 0;  // position of this op among the recorded ops of its batch
  Direction direction = Direction::Forward;
  std::string module_path;   // as named_modules() names it; "" for the root
  std::string module_class;  // "Linear", "T5LayerFF", ...
  std::string op;            // "aten::addmm", ...; backward frames: the autograd node, "AddmmBackward0"
  std::string forward_op;    // backward frames: the forward op the node differentiates, "aten::addmm"
  Attribution attribution = Attribution::ModelRoot;
  std::vector<Entry> entries;  // parameters, then inputs, then outputs (HF's order)
  int64_t entries_omitted = 0; // entries beyond the per-frame limit (counted, checked, not kept)
  bool inputs_finite = true;   // all inputs and parameters finite
  bool outputs_finite = true;
  // A forward op run again inside the backward: gradient checkpointing recomputes a block there.
  bool recomputed = false;
  // Not empty: reading this frame failed (what was thrown); it holds what was read before.
  std::string error;
};

// One FP8 slot (module path x role) at one step under one recipe: what the cast did.
struct Fp8SlotMetrics {
  int64_t step = 0;            // the batch number
  std::string module_path;
  std::string role;            // "activation", "weight", "gradient"
  std::string recipe = "delayed";  // "delayed", "current", "mxfp8", "nvfp4", "float8block" (docs/fp8.md)
  std::string format;          // the element format: "E4M3", "E5M2", "E2M1" (nvfp4)
  int64_t uses = 0;            // GEMM inputs of this slot in this step
  double cur_amax = 0;         // max |x| this step
  // delayed: the scale delayed scaling uses this step (history up to t-1); current: the scale of
  // cur_amax; nvfp4: the FP32 tensor scale of cur_amax; mxfp8: 1 (its scales are per block).
  double delayed_scale = 1;
  double current_scale = 1;    // the scale this step's amax alone calls for (nvfp4, mxfp8: as above)
  double drift_log2 = 0;       // log2(delayed / current); > 0: values overflow (delayed only)
  int64_t count = 0;           // finite elements cast
  int64_t overflow = 0, underflow = 0;
  double overflow_pct = 0, underflow_pct = 0;
  double mse = 0, cosine = 1, sqnr_db = 0;
  // Block recipes (mxfp8, nvfp4, float8block) only: the scales (blocks, or 16 x 16 and 128 x 128
  // tiles for nvfp4 and float8block weights), those whose amax is 0, whose scale was clamped at
  // its largest or smallest value, that held an inf or NaN, the finite elements lost to a NaN
  // scale, and the blocks per scale value (ascending; mxfp8: powers of two, nvfp4: the E4M3
  // block scales, float8block: the power of two of each scale_inv, its value when the scales are
  // powers of two).
  int64_t blocks = 0, blocks_zero = 0, blocks_saturated = 0, blocks_at_min = 0, blocks_nonfinite = 0;
  int64_t lost = 0;
  std::vector<std::pair<double, int64_t>> block_scales;
};

struct Fp8Alarm {
  Fp8SlotMetrics metrics;
  std::string reason;  // "overflow 2.31% > 0.10%", "drift 0.74 > 0.50"
};

// Can this model run in fp16 or bf16? The first frames whose entries would overflow on the cast.
struct HeadroomSummary {
  std::optional<Frame> first_fp16_overflow;
  std::optional<Frame> first_bf16_overflow;
  int64_t frames_checked = 0;
  int64_t frames_fp16_overflow = 0;
  int64_t frames_fp16_underflow = 0;
  int64_t frames_bf16_overflow = 0;
  int64_t frames_bf16_underflow = 0;
};

// Tensors read off the op's own thread: where they live (CUDA), how much waited and how often the
// host waited for it; and CPU inputs read on a second thread while their op ran.
struct DeviceCounters {
  int64_t tensors_read_on_device = 0;     // reductions started on a device
  int64_t device_reads_reused = 0;        // device tensors whose memory an earlier read in the batch covered
  int64_t tensors_skipped_on_device = 0;  // device tensors not read (dtype, gapped view, graph capture)
  int64_t frames_deferred = 0;            // frames that waited for a read-back
  int64_t readbacks = 0;                  // host synchronisations: one per read-back
  int64_t tensors_read_beside_ops = 0;    // Options::read_inputs_beside_ops: inputs handed over
};

// Non-finite values a model meant (a -inf mask, a `torch.where` branch not taken), tolerated by the
// place rule (docs/nonfinite.md) while they stayed inside the module that made them: counted per
// module and op, so that nothing is hidden. `allowed`: tolerated by an allow_nonfinite pattern.
struct ToleratedCount {
  std::string module_path;
  std::string module_class;
  std::string op;
  bool allowed = false;
  // Frames whose results held them (or, when allowed or absorbed inside compiled code, whose
  // arguments did).
  int64_t frames = 0;
  int64_t nan = 0;     // elements, over those frames
  int64_t pos_inf = 0;
  int64_t neg_inf = 0;
  int64_t first_batch = 0;
  int64_t last_batch = 0;
};

// How a value tolerated inside the module that made it became an error (the place rule).
enum class Escape {
  None,      // the detecting frame is judged on its own: it made or met the value as an error
  Read,      // an op of another module read it
  Written,   // it was written into a tensor the module did not make (a parameter, a buffer, its input)
  Returned,  // the module's forward returned it
};

// What this rank's non-finite values were, among the ranks.
enum class RankRole {
  Alone,     // one process, or no exchange took place
  Made,      // the value appeared on this rank (its own computation or inputs)
  Received,  // it arrived from another rank (through a collective, e.g. a gradient all-reduce)
  Stopped,   // this rank saw no inf/nan: it stops because another rank did
};

// One rank's first non-finite value, as exchanged between the ranks.
struct RankEvent {
  int64_t rank = -1;
  int64_t batch_number = 0;
  Direction direction = Direction::Forward;
  int64_t op_index = 0;
  std::string frame;   // "layers.1 (Linear) aten::addmm"
  std::string origin;  // that rank's origin line
  RankRole role = RankRole::Made;  // Made or Received, as that rank judged it
  std::string host;                // where that rank ran (its host name), and its
  int64_t local_rank = -1;         // LOCAL_RANK there (which GPU), -1 if not set
};

// What the ranks agreed on at the last exchange. Events are ordered by batch, then made before
// received, then op index, then rank: data-parallel ranks run the same ops in the same order,
// so no clocks are needed.
struct RankAgreement {
  bool exchanged = false;          // an exchange took place
  std::optional<RankEvent> first;  // the first rank to see inf/nan (none: no answering rank did)
  RankRole role = RankRole::Alone; // this rank
  std::vector<int64_t> tripped;    // ranks that saw inf/nan, ascending
  std::vector<int64_t> missing;    // ranks that did not answer within the timeout
  std::string problem;             // why the exchange could not complete, if it could not
  std::string host;                // this rank's host name, and
  int64_t local_rank = -1;         // its LOCAL_RANK (-1 if not set)
};

struct Report {
  int64_t batch_number = 0;
  std::vector<Frame> frames;  // oldest first; the last one is where inf/nan was detected
  // True when the detecting frame's inputs and parameters were finite: the value was made there.
  bool produced_here = false;
  std::string origin;          // one line: where the first non-finite value appeared and why
  // The op that made the value, when the detecting frame met one that had been tolerated inside
  // the module that made it, and how it left that module (the place rule).
  std::optional<Frame> origin_frame;
  Escape escape = Escape::None;
  // The values tolerated so far, per module and op (none under Options::strict).
  std::vector<ToleratedCount> tolerated;
  int64_t rank = 0;
  int64_t world_size = 1;
  RankAgreement ranks;  // world_size > 1
  // The C++ call stack of the thread that ran the op, innermost first, with the sentinel's and
  // LibTorch's own frames collapsed into "[... N library frames]" lines. Empty when unavailable.
  std::vector<std::string> stack;
  // TorchScript models: the TorchScript call stack at the op, innermost first ("file:line: code").
  std::vector<std::string> torchscript_stack;
  // Models watched from Python (the overflow_sentinel module): the Python source lines that ran the
  // op, innermost first ("model.py:123: hidden_gelu * hidden_linear  (in forward)").
  std::vector<std::string> python_stack;
  // Found when a device's numbers were read back (at batch end or every N frames), after the op
  // had run: the stacks above are then empty, as the op's own are gone. Options::device_sync_each_op
  // stops at the op itself, with its stacks.
  bool deferred = false;
  // DumpOptions::on_detection: the directory holding the arguments and results of the op that
  // made the inf/nan (`sentinel replay DIR` re-runs it); empty when none was saved.
  std::string dump_dir;
  // What the batch was, where the caller said (Watchdog::set_phase): "evaluation" for a forward a
  // Trainer ran between its steps; empty otherwise.
  std::string phase;

  // "nonfinite" (frames and origin), "fp8_alarm" (alarms; frames may be empty), "peer_nonfinite"
  // (another rank saw inf/nan, this one did not: its last frames) or "ranks_missing" (ranks did not
  // answer the exchange).
  std::string kind = "nonfinite";
  std::vector<Fp8Alarm> fp8_alarms;
  std::vector<Fp8SlotMetrics> fp8_metrics;  // the last closed FP8 step, when FP8 is watched

  // The frame where inf/nan was detected (an empty frame for FP8 alarm reports, which have none).
  const Frame& trigger() const {
    static const Frame none;
    return frames.empty() ? none : frames.back();
  }
};

// HF's layout: "Detected inf/nan during batch_number=N", "Last K forward frames:", ...
std::string render_text(const Report& report);
// One frame in HF's layout (used by trace mode and render_text).
std::string render_frame_text(const Frame& frame);
// HF's trace header: "\n\n<17 spaces> *** Starting batch number=N ***\nabs min  abs max  metadata\n";
// with a rank (>= 0), "*** Starting batch number=N on rank R ***".
std::string batch_header(int64_t batch_number, int64_t rank = -1);
// Versioned JSON described by reports/report.schema.json.
std::string render_json(const Report& report);
// One slot's metrics as a text line, and as one JSON object on one line (fp8_metrics.jsonl).
std::string render_fp8_metrics_text(const Fp8SlotMetrics& m);
std::string fp8_metrics_json_line(const Fp8SlotMetrics& m);
// Several recipes side by side: one row per slot (module path x role) and, per recipe, its
// overflow and underflow percentages and SQNR; then the block recipes' scale counts.
std::string render_fp8_recipe_table(const std::vector<Fp8SlotMetrics>& metrics);
const char* to_string(Attribution a);
const char* to_string(Direction d);
const char* to_string(EntryKind k);
const char* to_string(EntryRole r);
const char* to_string(RankRole r);
const char* to_string(Escape e);
// The ranks' part of a text report ("" when world_size is 1).
std::string render_ranks_text(const Report& report);
// The values the place rule tolerated, a line per module and op ("" when none).
std::string render_tolerated_text(const std::vector<ToleratedCount>& tolerated);

}  // namespace sentinel
