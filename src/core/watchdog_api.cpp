// The public Watchdog and BatchGuard: construction, and the calls that reach the Impl.
#include <sentinel/watchdog.h>

#include <torch/csrc/jit/api/module.h>
#include <torch/nn/module.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <iterator>
#include <limits>
#include <stdexcept>

#include "capture/loop_window.h"
#include "core/entry_builder.h"
#include "core/watchdog_impl.h"
#include "report/report_files.h"

namespace sentinel {

namespace {

// Once the model is indexed: the observers' selections checked against its modules, the loggers
// opened under this rank's names.
void attach_observers(Watchdog::Impl& impl) {
  const auto& id = impl.ranks.session().identity();
  impl.observers.attach(impl.index->module_paths(), id.rank, id.world_size);
  impl.warn_of_unmatched_allowances();
}

}  // namespace

// ---- Watchdog ---------------------------------------------------------------------------------

Watchdog::Watchdog(std::shared_ptr<torch::nn::Module> model, Options options) {
  if (!model) throw OptionError("sentinel::Watchdog: the model is null");
  options.validate();
  auto impl = std::make_unique<Impl>(nullptr, std::move(options));
  report::prepare_report_dir(impl->delivery.files_dir());
  impl->index =
      std::make_unique<core::ModelIndex>(std::move(model), impl->strings, impl->places);
  attach_observers(*impl);
  // A C++ model may call scripted parts: the fusers are off for them too.
  if (!impl->opts.keep_torchscript_fusion()) impl->fusion_off = std::make_unique<torchscript::FusionOff>(nullptr);
  impl_ = std::move(impl);
}

Watchdog::Watchdog(const torch::jit::Module& model, Options options) {
  options.validate();
  // (A TorchScript forward opens its batch inside an op callback: refused here, not there.)
  if (!options.exact()) throw OptionError(Impl::kModuleBoundariesOnlyInPython);
  auto impl = std::make_unique<Impl>(nullptr, std::move(options));
  report::prepare_report_dir(impl->delivery.files_dir());
  impl->index = std::make_unique<core::ModelIndex>(model, impl->strings, impl->places);
  attach_observers(*impl);
  if (!impl->opts.keep_torchscript_fusion()) impl->fusion_off = std::make_unique<torchscript::FusionOff>(&model);
  impl_ = std::move(impl);
}

Watchdog::~Watchdog() = default;

BatchGuard Watchdog::batch() {
  impl_->throw_pending();
  return BatchGuard(impl_->begin_explicit_batch() ? this : nullptr);
}

void Watchdog::end_batch(bool unwinding) { impl_->end_explicit_batch(unwinding); }

void Watchdog::check() { impl_->throw_pending(); }

void Watchdog::backward(const at::Tensor& loss) {
  // A trip of this batch's forward: the ranks meet here, as they do after a backward.
  if (impl_->has_pending()) impl_->exchange_ranks(ranks::Phase::Backward);
  impl_->throw_pending();
  loss.backward();
  after_backward();
}

void Watchdog::after_backward() {
  check_gradients();
  // The ranks meet here, before the user's gradient all-reduce could spread an inf/nan.
  meet_after_backward();
}

void Watchdog::check_gradients() {
  impl_->check_parameter_gradients();
  impl_->deliver_step_outcome();
}

void Watchdog::meet_after_backward() {
  impl_->exchange_ranks(ranks::Phase::Backward);
  impl_->throw_pending();
}

HeadroomSummary Watchdog::headroom() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->headroom_summary;
}

std::vector<StatRecord> Watchdog::collected_stats() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->observers.last_stats();
}

std::vector<Fp8SlotMetrics> Watchdog::fp8_metrics() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->observers.last_fp8_metrics();
}

void Watchdog::set_phase(std::string phase) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->next_phase = std::move(phase);
}

void Watchdog::set_inside_compiled_code(bool inside) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->inside_compiled_code = inside;
  // Parameters too: compiled code may update its mutated inputs in place.
  impl_->forget_reads();
}

void Watchdog::set_every_forward_scoped(bool scoped) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->every_forward_scoped = scoped;
}

void Watchdog::set_local_tensor_reader(std::function<at::Tensor(const at::Tensor&)> local) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->local_tensor_of = std::move(local);
}

void Watchdog::Impl::forget_reads() {
  readers.cpu.cache().clear();
  readers.device.reads().clear();
  read_magnitudes.clear();  // (what was written without a version count is not what was read)
}

void Watchdog::Impl::forget_reads_of(const std::vector<at::Tensor>& written) {
  std::vector<const c10::StorageImpl*> storages;
  for (const auto& t : written) {
    if (t.defined() && t.has_storage()) storages.push_back(t.storage().unsafeGetStorageImpl());
  }
  std::sort(storages.begin(), storages.end());
  readers.cpu.cache().forget_storages(storages);
  readers.device.reads().forget_storages(storages);
}

void Watchdog::set_compiler_running(bool running) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->compiler_running = running;
}

int64_t Watchdog::batch_number() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->batches.next();
}

void Watchdog::set_batch_number(int64_t next) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (next < 0) throw std::invalid_argument(fmt::format("sentinel: a batch number is >= 0, not {}", next));
  if (impl_->batches.open()) throw std::logic_error("sentinel: the batch number is set between batches, not inside one");
  if (next < impl_->batches.next()) impl_->ranks.session().renumber();
  impl_->batches.set_next(next);
}

std::optional<Report> Watchdog::last_report() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->delivery.last_report();
}

std::vector<Frame> Watchdog::saved_frames() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  std::vector<Frame> frames;
  for (size_t i = 0; i < impl_->ring.size(); ++i) frames.push_back(impl_->to_frame(impl_->ring.at(i)));
  return frames;
}

std::vector<ToleratedCount> Watchdog::tolerated() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->delivery.policy().tolerated();
}

bool Watchdog::tolerating() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->place_rule && impl_->place_rule->holds_any();
}

void Watchdog::returned(const torch::nn::Module& module, const std::vector<at::Tensor>& outputs) {
  std::unique_lock<std::mutex> lock(impl_->mutex);
  if (!impl_->index) return;
  if (const auto place = impl_->index->module_place(&module)) impl_->check_returned(*place, outputs, lock);
}

void Watchdog::module_boundary(const torch::nn::Module& module, bool returning,
                               const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  std::unique_lock<std::mutex> lock(impl_->mutex);
  if (!impl_->index || tensors.empty()) return;
  using Kind = Impl::BoundaryFrame;
  if (const auto place = impl_->index->module_place(&module)) {
    impl_->record_boundary(*place, returning ? Kind::Returned : Kind::Handed, tensors, lock);
  }
}

void Watchdog::compiled_call_returned(const torch::nn::Module& module,
                                      const std::vector<std::pair<std::string, at::Tensor>>& outputs) {
  std::unique_lock<std::mutex> lock(impl_->mutex);
  if (!impl_->index || outputs.empty()) return;
  if (const auto place = impl_->index->module_place(&module)) {
    impl_->record_boundary(*place, Impl::BoundaryFrame::Compiled, outputs, lock);
  }
}

void Watchdog::module_returned(const torch::nn::Module& module,
                               const std::vector<std::pair<std::string, at::Tensor>>& inputs,
                               const std::vector<std::pair<std::string, at::Tensor>>& outputs,
                               const std::vector<std::pair<std::string, at::Tensor>>& buffers) {
  std::unique_lock<std::mutex> lock(impl_->mutex);
  if (!impl_->index || impl_->ops_watched) return;
  if (const auto place = impl_->index->module_place(&module)) {
    impl_->record_whole_module(module, *place, inputs, outputs, buffers, lock);
  }
}

bool Watchdog::watching_ops() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->ops_watched;
}

void Watchdog::watch_loop_ops(bool on) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (!impl_->boundary_batch_open || on == impl_->loop_ops_watched) return;
  if (on && !capture::open_loop_window(impl_->anchor)) return;
  if (!on) capture::close_loop_window(impl_->anchor.get());
  impl_->loop_ops_watched = impl_->ops_watched = on;
}

void Watchdog::check_written(const std::string& what, const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  std::unique_lock<std::mutex> lock(impl_->mutex);
  if (!impl_->index || impl_->ops_watched || tensors.empty()) return;
  impl_->record_written(what, tensors, lock);
}

double Watchdog::read_magnitude(const std::vector<at::Tensor>& tensors) const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  double largest = 0.0;
  for (const at::Tensor& t : tensors) {
    if (!t.defined() || t.is_inference()) return std::numeric_limits<double>::quiet_NaN();
    const Impl::ReadMagnitude* known = impl_->magnitude_of(t.unsafeGetTensorImpl());
    if (!known) return std::numeric_limits<double>::quiet_NaN();
    largest = std::max(largest, known->abs_max);
  }
  return largest;
}

void Watchdog::proven_finite(const std::vector<at::Tensor>& tensors, double bound) {
  if (!std::isfinite(bound) || bound < 0) return;
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->forget_reads_of(tensors);
  impl_->prove_finite(tensors, bound);
}

namespace {

Watchdog::Impl::NamedPart bytes_of(const at::Tensor& t, uint32_t name) {
  const auto size = static_cast<int64_t>(t.element_size());
  return {t.storage_offset() * size, (t.storage_offset() + t.numel()) * size, name};
}

}  // namespace

void Watchdog::name_tensors(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto& named = impl_->named_storages;
  // Storages freed since are dropped once the table has doubled: FSDP names each gradient as the
  // backward makes it, one call per parameter.
  if (named.size() >= 2 * impl_->named_storages_kept + 64) {
    for (auto it = named.begin(); it != named.end();) it = it->second.storage.expired() ? named.erase(it) : std::next(it);
    impl_->named_storages_kept = named.size();
  }
  for (const auto& [name, t] : tensors) {
    if (!t.defined() || !t.has_storage()) continue;
    const Impl::NamedPart part = bytes_of(t, impl_->strings.intern(name));
    auto found = named.find(core::storage_key(t));
    if (found == named.end() || found->second.storage.lock().get() != t.storage().unsafeGetStorageImpl()) {
      found = named.insert_or_assign(core::storage_key(t), Impl::NamedStorage{t.storage().getWeakStorageImpl(), {}})
                  .first;
    }
    auto& entry = found->second;
    auto same = std::find_if(entry.parts.begin(), entry.parts.end(),
                             [&](const Impl::NamedPart& p) { return p.begin == part.begin && p.end == part.end; });
    if (same != entry.parts.end()) same->name = part.name;
    else entry.parts.push_back(part);
  }
}

uint32_t Watchdog::Impl::storage_name(const at::Tensor& t) const {
  if (named_storages.empty() || !t.defined() || !t.has_storage()) return 0;
  const auto it = named_storages.find(core::storage_key(t));
  if (it == named_storages.end()) return 0;
  const auto alive = it->second.storage.lock();
  if (alive.get() != t.storage().unsafeGetStorageImpl()) return 0;
  const auto& parts = it->second.parts;
  if (parts.size() == 1) return parts.front().name;  // the storage's one tensor, or a view of it
  // The named tensor whose bytes hold this one's (itself, or a view into it).
  const NamedPart want = bytes_of(t, 0);
  for (const auto& p : parts) {
    if (p.begin <= want.begin && want.end <= p.end) return p.name;
  }
  return 0;
}

namespace {

void tensors_in(const c10::IValue& v, std::vector<at::Tensor>& out, int depth = 0) {
  if (v.isTensor()) {
    out.push_back(v.toTensor());
  } else if (depth < 4 && v.isTuple()) {
    for (const auto& item : v.toTupleRef().elements()) tensors_in(item, out, depth + 1);
  } else if (depth < 4 && v.isList()) {
    for (const auto& item : v.toListRef()) tensors_in(item, out, depth + 1);
  } else if (depth < 4 && v.isGenericDict()) {
    for (const auto& item : v.toGenericDict()) tensors_in(item.value(), out, depth + 1);
  }
}

}  // namespace

void Watchdog::batch_returned(const c10::IValue& output) {
  std::unique_lock<std::mutex> lock(impl_->mutex);
  if (!impl_->index || !impl_->place_rule) return;
  // Frames still waiting for a device's numbers have not been judged yet: the batch's end reads
  // them back anyway, so this costs no extra host wait.
  impl_->resolve_deferred(lock);
  if (!impl_->place_rule->holds_any()) return;
  std::vector<at::Tensor> tensors;
  tensors_in(output, tensors);
  impl_->check_returned(impl_->index->root_place(), tensors, lock);
}

const Options& Watchdog::options() const { return impl_->opts; }

// ---- BatchGuard -------------------------------------------------------------------------------

BatchGuard::BatchGuard(Watchdog* owner) : owner_(owner), uncaught_at_start_(std::uncaught_exceptions()) {}

BatchGuard::BatchGuard(BatchGuard&& other) noexcept
    : owner_(other.owner_), uncaught_at_start_(other.uncaught_at_start_) {
  other.owner_ = nullptr;
}

void BatchGuard::finish() {
  if (!owner_) return;
  Watchdog* w = owner_;
  owner_ = nullptr;
  w->end_batch();
  w->check();
}

BatchGuard::~BatchGuard() noexcept(false) {
  if (!owner_) return;
  Watchdog* w = owner_;
  owner_ = nullptr;
  const bool unwinding = std::uncaught_exceptions() != uncaught_at_start_;
  w->end_batch(unwinding);
  // Never throw while another exception unwinds the stack (that would terminate).
  if (!unwinding) w->check();
}

}  // namespace sentinel
