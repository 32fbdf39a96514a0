#pragma once
// The floor of watching by reading: bare LibTorch op callbacks that read the inputs and outputs
// of each outermost op (the statistics pass alone, its numbers dropped), each tensor's memory once
// per version as the watchdog's cache does, with none of the watchdog's other work (frames,
// attribution, detection, reads on the second core). Paired against an unwatched run it measures
// what reading costs inside a model.
#include <ATen/record_function.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "stats/tensor_stats.h"

namespace bench {

class BareReads {
 public:
  BareReads() {
    handle_ = at::addGlobalCallback(at::RecordFunctionCallback(&BareReads::on_start, &BareReads::on_end)
                                        .needsInputs(true)
                                        .needsOutputs(true)
                                        .scopes({at::RecordScope::FUNCTION}));
  }
  ~BareReads() { at::removeCallback(handle_); }
  BareReads(const BareReads&) = delete;
  BareReads& operator=(const BareReads&) = delete;

  // Reads happen only between begin() and end(), each tensor's memory once in between.
  void begin() { state().on = true; }
  void end() {
    state().on = false;
    state().seen.clear();
    state().kept.clear();
  }
  // Bytes read, and seconds spent reading them, since the last call.
  std::pair<double, double> take_bytes_and_seconds() {
    const std::pair<double, double> r{state().bytes, state().seconds};
    state().bytes = state().seconds = 0;
    return r;
  }

 private:
  struct State {
    bool on = false;
    int depth = 0;
    double bytes = 0, seconds = 0;
    std::set<std::tuple<const c10::StorageImpl*, int64_t, int64_t, int64_t>> seen;
    std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> kept;
  };
  static State& state() {
    static State s;  // the benchmarks run the model on one thread
    return s;
  }
  // The inputs are read at the op's start: LibTorch 2.x keeps them for the start callback only
  // (by the end the argument stack they point into has been consumed), as the watchdog does.
  static std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
    State& s = state();
    if (s.depth++ != 0 || !s.on) return nullptr;  // nested ops run inside the outermost one
    timed_read(fn.inputs());
    return nullptr;
  }
  template <typename Values>
  static void timed_read(const Values& values) {
    at::RecordFunctionGuard off(false);
    const auto start = std::chrono::steady_clock::now();
    read(values);
    state().seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  template <typename Values>
  static void read(const Values& values) {
    for (const auto& v : values) {
      if (!v.isTensor()) continue;
      const at::Tensor& t = v.toTensor();
      if (!t.defined() || t.numel() == 0) continue;
      // Dense memory is read once per version (an in-place op bumps it: its result is read
      // again); a view with gaps every time, as the watchdog does. Keyed by the storage, kept
      // by a weak reference so that a new storage cannot take its address within the forward.
      const bool dense = t.is_non_overlapping_and_dense() && !t.is_inference() && t.has_storage();
      if (dense) {
        c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
        if (!state().seen.emplace(storage, t.storage_offset(), t.numel(), t._version()).second) continue;
        state().kept.emplace_back(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(storage));
      }
      sentinel::TensorStats s;
      if (sentinel::stats::compute(t, s) == sentinel::stats::Readability::Read) state().bytes += static_cast<double>(t.nbytes());
    }
  }
  static void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
    State& s = state();
    if (--s.depth != 0 || !s.on) return;
    timed_read(fn.outputs());
  }
  at::CallbackHandle handle_;
};

}  // namespace bench
