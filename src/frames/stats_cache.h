#pragma once
// Statistics of CPU tensors already read in this batch. An op's output is usually the next op's
// input, and a weight serves its ops through views such as weight.t(): reading each block of
// memory once halves the sentinel's memory traffic. Keyed by the memory a tensor covers, and
// reused only while that memory provably holds the same values (frames/tensor_memory.h). Cleared
// at each batch start and end (but for the parameters' entries, if the user asks to keep them);
// the entries of tensors that died are dropped as reads come in. Reads on the watching thread,
// large ones across ATen's threads (stats::compute_across_threads).
#include <ATen/core/Tensor.h>

#include <vector>

#include "frames/tensor_memory.h"
#include "stats/tensor_stats.h"

namespace sentinel {
namespace frames {

class StatsCache {
 public:
  // Returns the readability and fills `out`, reading the tensor only on a miss (always with
  // `reuse` false; what it reads is kept either way).
  stats::Readability compute(const at::Tensor& t, TensorStats& out, bool reuse = true) {
    if (!cacheable(t)) return stats::compute_across_threads(t, out);
    const uint32_t version = version_of(t);
    stats::Readability r;
    if (reuse && lookup(t, version, out, r)) return r;
    r = stats::compute_across_threads(t, out);
    reads_.drop_dead_tensors_when_due();
    reads_.insert(t, version, Read{out, r});
    return r;
  }
  // Whether `t` can be served from the cache at all.
  static bool cacheable(const at::Tensor& t) { return t.defined() && t.device().is_cpu() && keyed_memory(t); }
  static uint32_t version_of(const at::Tensor& t) { return frames::version_of(t); }
  // A hit: the numbers of `t`'s memory, read earlier in this batch and provably unchanged.
  bool find(const at::Tensor& t, TensorStats& out, stats::Readability& r) {
    return cacheable(t) && lookup(t, version_of(t), out, r);
  }
  // What a read of `t` found at `version` (an earlier one), if that read is still held.
  bool find_at(const at::Tensor& t, uint32_t version, TensorStats& out, stats::Readability& r) {
    return cacheable(t) && lookup(t, version, out, r);
  }
  // Remembers what a read of `t` at `version` found; nothing if `t` has been written since.
  void store(const at::Tensor& t, uint32_t version, const TensorStats& stats, stats::Readability r) {
    if (cacheable(t) && version_of(t) == version) {
      reads_.drop_dead_tensors_when_due();
      reads_.insert(t, version, Read{stats, r});
    }
  }
  // Reads those of `tensors` not held already at once, split between ATen's threads, and keeps
  // what they hold (one op's list of tensors: their entries then find them here).
  void read_ahead(c10::ArrayRef<at::Tensor> tensors) {
    ahead_.clear();
    for (const auto& t : tensors) {
      if (cacheable(t) && !reads_.find(t, version_of(t))) ahead_.push_back(t);
    }
    if (ahead_.size() >= 2) {
      ahead_stats_.resize(ahead_.size());
      ahead_readability_.resize(ahead_.size());
      stats::compute_many(ahead_, ahead_stats_.data(), ahead_readability_.data());
      for (size_t i = 0; i < ahead_.size(); ++i) {
        reads_.drop_dead_tensors_when_due();
        reads_.insert(ahead_[i], version_of(ahead_[i]), Read{ahead_stats_[i], ahead_readability_[i]});
      }
    }
    ahead_.clear();  // holds no tensor alive
  }
  void clear() { reads_.clear(); }
  // Drops the entries of memory in these storages (sorted; a write LibTorch did not count).
  void forget_storages(const std::vector<const c10::StorageImpl*>& storages) {
    if (storages.empty()) return;
    reads_.erase_storages(storages);
  }
  // Drops every entry except those of the tensors tensor_of(item) for the items of `keep`
  // (parameters kept across batches, Options::reuse_unchanged_parameter_reads). A kept entry is
  // still checked against the tensor's data pointer and version counter when it is looked up.
  template <typename Range, typename TensorOf>
  void clear_except(const Range& keep, TensorOf tensor_of) {
    reads_.clear_except(keep, tensor_of);
  }
  size_t hits() const { return hits_; }
  size_t size() const { return reads_.size(); }  // entries held

 private:
  struct Read {
    TensorStats stats;
    stats::Readability readability;
  };
  // Of a cacheable tensor at `version`.
  bool lookup(const at::Tensor& t, uint32_t version, TensorStats& out, stats::Readability& r) {
    const Read* read = reads_.find(t, version);
    if (!read) return false;
    out = read->stats;
    r = read->readability;
    ++hits_;
    return true;
  }
  MemoryMap<Read> reads_;
  size_t hits_ = 0;
  // read_ahead's, kept for their capacity: no allocation per op.
  std::vector<at::Tensor> ahead_;
  std::vector<TensorStats> ahead_stats_;
  std::vector<stats::Readability> ahead_readability_;
};

}  // namespace frames
}  // namespace sentinel
