// The hot path: what the watchdog does with each outermost op.
#include <ATen/core/Tensor.h>
#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>
#include <c10/util/SmallVector.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/jit/runtime/interpreter.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "capture/op_call.h"
#include "capture/thread_state.h"
#include "core/entry_builder.h"
#include "core/gemm_ops.h"
#include "core/uninitialized_ops.h"
#include "overlap/pure_ops.h"
#include "core/watchdog_impl.h"
#include "core/written_arguments.h"
#include "stats/tensor_stats.h"

namespace sentinel {

using frames::EntryRecord;
using frames::EntryState;
using frames::FrameRecord;
using frames::Role;
using core::plain_entry;

namespace {

bool is_tensor_type(const c10::TypePtr& type) {
  c10::TypePtr t = type;
  if (t->kind() == c10::TypeKind::OptionalType) t = t->expectRef<c10::OptionalType>().getElementType();
  if (t->kind() == c10::TypeKind::ListType) t = t->expectRef<c10::ListType>().getElementType();
  return t->kind() == c10::TypeKind::TensorType;
}

// The op's own arguments: boxed calls (the TorchScript interpreter) hand RecordFunction the whole
// interpreter stack, whose last entries they are.
c10::ArrayRef<c10::IValue> own_arguments(const capture::OpCall& fn, const OpInfo& info) {
  auto inputs = fn.inputs();
  if (info.num_args >= 0 && inputs.size() > static_cast<size_t>(info.num_args)) {
    inputs = inputs.slice(inputs.size() - info.num_args);
  }
  return inputs;
}

}  // namespace

const OpInfo& Watchdog::Impl::op_info(const capture::OpCall& fn, uint32_t name_id) {
  if (name_id >= op_infos.size()) op_infos.resize(name_id + 1);
  OpInfo& info = op_infos[name_id];
  if (info.known) return info;
  info.known = true;
  info.display_name = strings.intern(fn.name());
  if (auto schema = fn.schema()) {
    const auto& returns = schema->returns();
    bool all_views = !returns.empty();
    for (const auto& r : returns) {
      const auto* alias = r.alias_info();
      all_views = all_views && alias != nullptr && !alias->isWrite();
    }
    info.collective = core::writes_asynchronously(fn.name());
    const bool views_by_schema = opts.skip_view_ops() && all_views;
    info.may_copy = views_by_schema && !core::always_a_view(fn.name());
    info.uninitialized_results = core::returns_uninitialized(fn.name());
    info.skip = (views_by_schema && !info.may_copy) || info.collective;
    info.num_args = static_cast<int>(schema->arguments().size());
    info.num_returns = static_cast<int>(returns.size());
    info.tensor_args = 0;
    const auto& args = schema->arguments();
    for (size_t i = 0; i < args.size() && i < 64; ++i) {
      if (is_tensor_type(args[i].type())) info.tensor_args |= (1ull << i);
      if (args[i].is_out()) info.overwritten_args |= (1ull << i);
    }
    if (core::overwrites_self(fn.name())) info.overwritten_args |= 1;
    bool writes_an_argument = info.overwritten_args != 0;
    for (const auto& a : args) writes_an_argument = writes_an_argument || (a.alias_info() && a.alias_info()->isWrite());
    info.pure = !writes_an_argument && overlap::writes_only_results(fn.name());
    info.writes = writes_an_argument;
    // A collective's writes land after it returns: there is nothing to read at its end.
    info.written_unreturned = info.collective ? 0 : core::written_unreturned(*schema);
    if (!info.collective) {
      core::running_statistics_written(*schema, &info.running_statistics, &info.running_statistics_flag);
      info.written_unreturned |= info.running_statistics;
      info.writes = info.writes || info.running_statistics != 0;
    }
    if (info.written_unreturned != 0) {
      core::gradients_written_when_unscaled(fn.name(), *schema, &info.written_when_unscaled, &info.grad_scale_arg);
      for (const auto& a : args) info.argument_names.push_back(strings.intern(a.name()));
    }
  } else {
    const std::string name = fn.name();
    info.writes = !name.empty() && name.back() == '_';  // no schema: ATen's in-place spelling
  }
  return info;
}

uint32_t Watchdog::Impl::gemm_mask(uint32_t op) {
  if (op >= gemm_by_op.size()) gemm_by_op.resize(op + 1, -1);
  if (gemm_by_op[op] < 0) gemm_by_op[op] = core::gemm_operands(strings.at(op));
  return static_cast<uint32_t>(gemm_by_op[op]);
}

void Watchdog::Impl::add_input(FrameRecord& f, const c10::IValue& v, int position, bool tensor_arg, bool probe_fp8,
                               bool gemm_operand, const core::ParamRef* param) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    const Role role = param ? Role::Param : Role::Input;
    GemmOperand gemm{param ? fp8::Role::Weight : fp8::Role::Activation};
    gemm.probe = probe_fp8 && t.defined();
    gemm.collect =
        gemm_operand && t.defined() && observers.collector().wants(f.batch_number, f.place, gemm.role, places);
    const bool read_as_operand = gemm.probe || gemm.collect;
    EntryRecord e = read_entry(f, t, role, position, -1, opts.headroom() && !read_as_operand,
                               read_as_operand ? &gemm : nullptr);
    if (param) e.param_name = parameter_label(*param, f.module_place);
    else e.path = storage_name(t);
    e.program_constant = t.defined() && t.unsafeGetTensorImpl()->is_wrapped_number();
    f.add(e);
    if (gemm_operand && observers.dumper().wants(f.batch_number, places.path(f.place))) {
      observers.dumper().save(t, places.path(f.place), fp8::role_name(gemm.role), f.batch_number, opts.output());
    }
  } else if (v.isTensorList()) {
    auto list = v.toTensorList();
    const auto held = read_ahead(list.vec());
    for (size_t j = 0; j < list.size(); ++j) {
      // A parameter handed in a list (a class token concatenated to the patches) is still named.
      const at::Tensor t = list.get(j);
      const core::ParamRef* p = t.defined() ? index->find_param(t) : nullptr;
      EntryRecord e = read_entry(f, t, p ? Role::Param : Role::Input, position, static_cast<int>(j), opts.headroom());
      if (p) e.param_name = parameter_label(*p, f.module_place);
      else e.path = storage_name(t);
      f.add(e);
    }
  } else if (v.isNone() && tensor_arg) {
    f.add(plain_entry(EntryState::None, Role::Input, position, -1));
  } else if (v.isDouble() && !std::isfinite(v.toDouble())) {
    f.nonfinite_constant = true;
  }
  // Other arguments (sizes, flags, scalars) configure the op; they hold no activations.
}

void Watchdog::Impl::add_outputs(FrameRecord& f, c10::ArrayRef<c10::IValue> outputs, bool& any_tensor) {
  const bool single = outputs.size() == 1 && outputs[0].isTensor();
  for (size_t i = 0; i < outputs.size(); ++i) {
    const auto& v = outputs[i];
    const int index = single ? -1 : static_cast<int>(i);
    if (v.isTensor()) {
      any_tensor = true;
      EntryRecord e = read_entry(f, v.toTensor(), Role::Output, index, -1, opts.headroom());
      e.path = storage_name(v.toTensor());
      f.add(e);
    } else if (v.isTensorList()) {
      any_tensor = true;
      auto list = v.toTensorList();
      const auto held = read_ahead(list.vec());
      for (size_t j = 0; j < list.size(); ++j) {
        EntryRecord e = read_entry(f, list.get(j), Role::Output, index, static_cast<int>(j), opts.headroom());
        e.path = storage_name(list.get(j));
        f.add(e);
      }
    } else if (v.isNone()) {
      f.add(plain_entry(EntryState::None, Role::Output, index, -1));
    } else {
      f.add(plain_entry(EntryState::NotATensor, Role::Output, index, -1));
    }
  }
}

void Watchdog::Impl::add_arguments(FrameRecord& f, c10::ArrayRef<c10::IValue> inputs, const OpInfo& info,
                                   c10::ArrayRef<const core::ParamRef*> params, uint32_t fp8_operands,
                                   uint32_t gemm_operands, uint32_t factors) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (i < 64 && ((info.overwritten_args >> i) & 1) && inputs[i].isTensor()) {
      frames::EntryRecord e = core::make_entry(params[i] ? Role::Param : Role::Input, static_cast<int>(i), -1);
      core::set_readability(e, inputs[i].toTensor(), stats::Readability::Overwritten);
      e.storage = core::storage_key(inputs[i].toTensor());
      if (params[i]) e.param_name = parameter_label(*params[i], f.module_place);
      f.add(e);
      continue;
    }
    if (i < 64 && ((info.overwritten_args >> i) & 1) && inputs[i].isTensorList()) {
      // An out= list (FSDP2's split_with_sizes_copy into the unsharded parameters): destinations.
      const auto list = inputs[i].toTensorList();
      for (size_t j = 0; j < list.size(); ++j) {
        const at::Tensor t = list.get(j);
        frames::EntryRecord e = core::make_entry(Role::Input, static_cast<int>(i), static_cast<int>(j));
        core::set_readability(e, t, stats::Readability::Overwritten);
        e.storage = core::storage_key(t);
        e.path = storage_name(t);
        f.add(e);
      }
      continue;
    }
    if (i < 32 && ((factors >> i) & 1)) {
      defer_factor(f, inputs[i].toTensor(), static_cast<int>(i), params[i]);
      continue;
    }
    add_input(f, inputs[i], static_cast<int>(i), i < 64 && ((info.tensor_args >> i) & 1), i < 32 && ((fp8_operands >> i) & 1),
              i < 32 && ((gemm_operands >> i) & 1), params[i]);
  }
}

uint32_t Watchdog::Impl::scope_place(capture::ThreadState& ts, uint32_t& module) {
  // Innermost module scope gives the base path; named scopes after it extend it.
  size_t base = ts.scopes.size();
  std::optional<uint32_t> module_place;
  for (size_t i = ts.scopes.size(); i-- > 0;) {
    if (ts.scopes[i].module) {
      module_place = index->module_place(ts.scopes[i].module);
      base = i;
      break;
    }
  }
  module = module_place ? *module_place : index->root_place();
  const size_t first_named = base == ts.scopes.size() ? 0 : base + 1;
  // Most ops run straight inside a module (every op of a Python model): its own place.
  if (module_place && first_named == ts.scopes.size()) return *module_place;
  std::string path = module_place ? places.path(*module_place) : std::string();
  std::string cls = module_place ? places.cls(*module_place) : std::string();
  for (size_t i = first_named; i < ts.scopes.size(); ++i) {
    path = path.empty() ? ts.scopes[i].name : path + "." + ts.scopes[i].name;
    cls = "scope";
  }
  return places.intern(path, cls);
}

namespace {

bool inside_machinery(const capture::ThreadState& ts) {
  // The named scopes inside the innermost module scope: a module's forward run from inside the
  // machinery (a forward FSDP's hook calls) is the model's again.
  for (size_t i = ts.scopes.size(); i-- > 0 && !ts.scopes[i].module;) {
    if (ts.scopes[i].machinery) return true;
  }
  return false;
}

}  // namespace

bool Watchdog::Impl::op_start(const capture::OpCall& fn, FrameRecord& f, capture::ThreadState& ts) {
  std::lock_guard<std::mutex> lock(mutex);
  // Inside a backward, the capture opens op frames only for a forward recomputed there (gradient
  // checkpointing) and PyTorch's machinery, which may run after their batch ended.
  const bool in_backward = ts.backward_depth > 0;
  const bool recomputed = in_backward && ts.recomputing_forward();
  if (delivery.stopped() || (!batches.open() && !in_backward) || compiler_running) return false;
  // The overload matters: aten::sum and aten::sum.dim_IntList differ in arguments and results.
  // (Spelled into a buffer kept between ops: no allocation once it is long enough.)
  op_key_text.assign(fn.name());
  if (const char* overload = fn.overload_name(); *overload != '\0') op_key_text.append(".").append(overload);
  const uint32_t name_id = strings.intern(op_key_text);
  const OpInfo& info = op_info(fn, name_id);
  // A collective's writes bump no version counter: every read kept so far may be of a tensor it
  // is about to overwrite.
  if (info.collective) {
    forget_reads();
    note_collective_writes(own_arguments(fn, info));
  }
  if (info.uninitialized_results) {
    f.op = info.display_name;  // (the end notes its results and makes no frame)
    f.op_key = name_id;
    f.batch_number = batches.current();
    f.recomputed = recomputed;
    f.undecided = FrameRecord::Undecided::UninitializedResults;
    // The buffer is its module's, as any op's result: what the module writes into it stays its own.
    f.in_model = !ts.scopes.empty() && !inside_machinery(ts) && !index->is_torchscript();
    if (f.in_model) f.place = scope_place(ts, f.module_place);
    return true;
  }
  if (info.skip) {
    // No frame for a view, but its backward node (TBackward0 of weight.t()) should still name
    // the module whose parameter it views.
    if (fn.seq_nr() >= 0) {
      for (const auto& v : own_arguments(fn, info)) {
        if (!v.isTensor() || !v.toTensor().defined()) continue;
        if (const core::ParamRef* p = index->find_param(v.toTensor())) {
          forward_ops[fn.seq_nr()] = ForwardOp{p->place, info.display_name, static_cast<uint8_t>(Attribution::Parameter)};
          break;
        }
      }
    }
    return false;
  }

  // Reading statistics must not build autograd history. (Ops run here are nested ops, which the
  // callback ignores: src/capture/record_hooks.cpp.)
  c10::InferenceMode no_autograd;

  readers.beside.collect(f);  // an earlier op's, should its end have gone unseen: never left running
  f.batch_number = batches.current();
  f.recomputed = recomputed;
  f.op = info.display_name;
  f.op_key = name_id;
  f.writes_arguments = info.writes;
  f.direction = static_cast<uint8_t>(Direction::Forward);
  const auto inputs = own_arguments(fn, info);
  c10::SmallVector<const core::ParamRef*, 8> params;
  const core::ParamRef* owner = find_params(inputs, ts, params);
  // Where every module's forward is scoped (Python), the running module owns the op, whichever
  // module's parameter it reads: a child's forward that ran would be the innermost scope. Not in
  // compiled code, whose graph inlines its children's forwards (their hooks never run).
  const bool running_module_owns = every_forward_scoped && !ts.scopes.empty() && !inside_compiled_code;

  // Whether the op is placed inside a module whose forward is seen: a TorchScript forward, an op
  // inside a module's scope (the Python module's hooks, sentinel::scope). The rest (the training
  // loop's ops, a C++ model's ops without scopes, named by a parameter or not) is judged strictly
  // by the place rule: nothing says where their module's forward ends. So is PyTorch's machinery
  // run inside a module's forward (FSDP's all-gather and its cast to param_dtype, in a pre-hook).
  f.in_model = !ts.scopes.empty() && !inside_machinery(ts);
  f.in_compiled_code = inside_compiled_code;
  if (index->is_torchscript()) {
    const auto hierarchy = torch::jit::currentModuleHierarchy();
    f.place = f.module_place = index->place_for_hierarchy(hierarchy);
    f.in_model = !hierarchy.empty();
    f.attribution = static_cast<uint8_t>(hierarchy.size() > 1 ? Attribution::ModuleHierarchy : Attribution::ModelRoot);
  } else if (owner && !running_module_owns) {
    f.place = f.module_place = owner->place;
    f.attribution = static_cast<uint8_t>(Attribution::Parameter);
  } else if (!ts.scopes.empty()) {
    f.place = scope_place(ts, f.module_place);
    const bool own_parameter = owner && owner->place == f.module_place;
    f.attribution = static_cast<uint8_t>(own_parameter ? Attribution::Parameter : Attribution::UserScope);
  } else {
    f.place = f.module_place = index->root_place();
    f.attribution = static_cast<uint8_t>(Attribution::ModelRoot);
  }
  // Ops recorded by autograd carry a sequence number; their backward nodes carry the same one.
  if (fn.seq_nr() >= 0) forward_ops[fn.seq_nr()] = ForwardOp{f.place, f.op, f.attribution};
  if (info.may_copy) {
    // Whether this call copies is known at its end, where its arguments are read if it did.
    f.undecided = FrameRecord::Undecided::CopyOrView;
    ts.ending_op.inputs.assign(inputs.begin(), inputs.end());
    return true;
  }
  // A recomputed GEMM's operands were probed when the forward first ran.
  const uint32_t gemm_operands = observers.want_operands() && !recomputed ? gemm_mask(f.op) : 0;
  core::Fp8Monitor& fp8 = observers.fp8();
  const uint32_t fp8_operands = fp8.enabled() ? fp8.wants(f.batch_number, gemm_operands, f.place, places) : 0;
  readers.beside.set_active(info.pure && core_left_idle);
  // Whatever an input's read throws, the reads after this op are not handed to the second thread.
  struct ReadingBeside {
    core::BesideReader& reader;
    ~ReadingBeside() { reader.set_active(false); }
  } reading_beside_until_here{readers.beside};
  const uint32_t factors = factors_to_defer(f, inputs, gemm_operands);
  add_arguments(f, inputs, info, params, fp8_operands, gemm_operands, factors);
  readers.beside.set_active(false);
  readers.beside.start(f);

  if (dumps_on_trip() || factors != 0 || info.written_unreturned != 0) {
    auto& held = ts.ending_op.inputs;
    held.clear();
    held.insert(held.end(), inputs.begin(), inputs.end());
  }
  if (info.written_unreturned != 0) note_written_versions(inputs, info, ts.ending_op.written_versions);
  return true;
}

void Watchdog::Impl::op_end(const capture::OpCall& fn, FrameRecord& f, capture::ThreadState& ts) {
  std::unique_lock<std::mutex> lock(mutex);
  readers.beside.collect(f);  // before the op's arguments can change again
  // (The capture layer releases the held arguments.)
  if (delivery.stopped() || (!batches.open() && ts.backward_depth == 0)) return;
  c10::InferenceMode no_autograd;

  bool any_tensor = false;
  c10::ArrayRef<c10::IValue> outputs = fn.outputs();
  const int num_returns = f.op_key < op_infos.size() ? op_infos[f.op_key].num_returns : -1;
  if (num_returns >= 0 && outputs.size() > static_cast<size_t>(num_returns)) {
    outputs = outputs.slice(outputs.size() - num_returns);
  }
  if (f.undecided == FrameRecord::Undecided::UninitializedResults) {
    note_uninitialized(outputs);
    if (place_rule && f.in_model) {
      for (const auto& v : outputs) {
        if (v.isTensor()) place_rule->made_uninitialized(core::storage_key(v.toTensor()), f.module_place);
      }
    }
    return;
  }
  if (f.undecided == FrameRecord::Undecided::CopyOrView && !settle_copy_or_view(f, outputs, ts)) return;
  if (f.op_key < op_infos.size() && !uninitialized.empty()) {
    note_written_memory(op_infos[f.op_key], outputs, ts.ending_op.inputs);
  }
  add_outputs(f, outputs, any_tensor);
  if (f.op_key < op_infos.size() && op_infos[f.op_key].written_unreturned != 0) {
    add_written_arguments(f, ts.ending_op.inputs, op_infos[f.op_key], ts.ending_op.written_versions, any_tensor);
  }
  if (f.factors_deferred) settle_factors(f, ts.ending_op.inputs);
  if (outputs.empty() && torchscript::is_fusion_group_name(strings.at(f.op).c_str())) {
    // A fused group kept (Options::keep_torchscript_fusion) still shows where it ran.
    frames::EntryRecord e = core::make_entry(Role::Output, -1, -1);
    core::set_readability(e, at::Tensor(), stats::Readability::InsideFusedKernel);
    f.add(e);
    any_tensor = true;
  }
  // Ops that return no tensor (size queries and the like) compute nothing to watch; an op that
  // threw has no outputs either.
  if (!any_tensor) return;
  if (observers.dumper().enabled() && gemm_mask(f.op) != 0 && outputs.size() == 1 && outputs[0].isTensor() &&
      observers.dumper().wants(f.batch_number, places.path(f.place))) {
    observers.dumper().save(outputs[0].toTensor(), places.path(f.place), "output", f.batch_number, opts.output());
  }
  // Should this op's frame trip, its arguments (held since its start) and results can be saved.
  auto& ending = ts.ending_op;
  if (dumps_on_trip()) {
    const OpInfo& info = op_infos[f.op_key];
    ending.frame = &f;
    ending.outputs = outputs;
    ending.op = fn.name();
    ending.overload = fn.overload_name();
    // ATen's in-place spelling, for ops with a schema (num_args known).
    ending.in_place = info.overwritten_args != 0 || (info.num_args >= 0 && !ending.op.empty() && ending.op.back() == '_');
  }
  finish_frame(f, lock);
  ending.frame = nullptr;
}

std::string Watchdog::Impl::dump_tripping_op(const FrameRecord& f, int64_t batch) {
  auto& ending = capture::thread_state().ending_op;
  if (ending.frame != &f || f.direction != static_cast<uint8_t>(Direction::Forward)) return "";
  const std::string dir =
      (std::filesystem::path(delivery.files_dir()) / fmt::format("sentinel_batch{}_dump", batch)).string();
  dumps::OpDump op{ending.op, ending.overload, places.path(f.place), batch, ending.in_place};
  const std::string error =
      dumps::save_op_dump(dir, op, ending.inputs, std::vector<c10::IValue>(ending.outputs.begin(), ending.outputs.end()));
  if (!error.empty()) {
    opts.output() << "sentinel: the op's arguments were not saved: " << error << "\n" << std::flush;
    return "";
  }
  return dir;
}

void Watchdog::Impl::note_headroom(const FrameRecord& f) {
  bool any = false, o16 = false, u16 = false, ob = false, ub = false;
  for (int i = 0; i < f.entry_count; ++i) {
    any |= f.entries[i].has_headroom;
    const auto& h = f.entries[i].headroom;
    o16 |= h.fp16_overflow > 0;
    u16 |= h.fp16_underflow > 0;
    ob |= h.bf16_overflow > 0;
    ub |= h.bf16_underflow > 0;
  }
  if (!any) return;  // gradient frames and frames of non-floating tensors carry no counts
  ++headroom_summary.frames_checked;
  headroom_summary.frames_fp16_overflow += o16;
  headroom_summary.frames_fp16_underflow += u16;
  headroom_summary.frames_bf16_overflow += ob;
  headroom_summary.frames_bf16_underflow += ub;
  if (o16 && !headroom_summary.first_fp16_overflow) headroom_summary.first_fp16_overflow = to_frame(f);
  if (ob && !headroom_summary.first_bf16_overflow) headroom_summary.first_bf16_overflow = to_frame(f);
}

void Watchdog::Impl::finish_frame(FrameRecord& f, std::unique_lock<std::mutex>& lock) {
  f.finished = true;
  f.op_index = batches.take_op_index();
  // Once one frame waits for a device, every later frame waits behind it: detection keeps order.
  device::DeferredFrames& deferred = readers.device.deferred();
  if (f.pending || !deferred.empty()) {
    deferred.push(f);
    ++device_counters.frames_deferred;
    if (opts.device_sync_each_op() || static_cast<int64_t>(deferred.size()) >= opts.device_readback_frames() ||
        2 * deferred.slots_in_flight() >= readers.device.device()->capacity()) {
      resolve_deferred(lock, /*last_is_current=*/true);
    }
    return;
  }
  process_frame(f, lock);
}

void Watchdog::Impl::process_frame(FrameRecord& f, std::unique_lock<std::mutex>& lock) {
  ring.push(f);
  if (opts.headroom()) note_headroom(f);
  if (batches.is_traced(f.batch_number)) {
    const Frame frame = to_frame(f);
    opts.output() << render_frame_text(frame) << std::flush;
    delivery.trace_frame(frame);
    return;
  }
  if (delivery.trips(f)) trip(lock, &f);
}

}  // namespace sentinel
