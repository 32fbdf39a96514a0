// Records through an all-gather on the user's process group: one fixed-size byte tensor per
// rank, on the CPU for Gloo and on the current CUDA device for NCCL.
#include <sentinel/errors.h>
#include <sentinel/ranks.h>

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "ranks/rank_channel.h"
#include "ranks/rank_record.h"

namespace sentinel {
namespace ranks {

namespace {

// Whether `work` completes within `longest`, polling. Work::wait(timeout) does not bound the
// host's wait on every backend: NCCL's only orders the current stream after the collective (unless
// TORCH_NCCL_BLOCKING_WAIT is set) and returns at once, and the copy to the host that follows would
// then wait on a dead rank until NCCL's own watchdog ends the process. isCompleted() never blocks.
bool completes_within(c10d::Work& work, std::chrono::milliseconds longest) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + longest;
  // Most all-gathers finish in well under a millisecond: short pauses first, then up to 5 ms.
  std::chrono::microseconds pause(20);
  while (!work.isCompleted()) {
    const auto now = Clock::now();
    if (now >= deadline) return false;
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, std::chrono::microseconds(5000));
  }
  return true;
}

class GroupChannel final : public RankChannel {
 public:
  explicit GroupChannel(c10::intrusive_ptr<c10d::ProcessGroup> group) : group_(std::move(group)) {}

  int64_t rank() const override { return group_->getRank(); }
  int64_t world_size() const override { return group_->getSize(); }
  void bind(int64_t, int64_t) override {}

  std::vector<std::optional<std::string>> exchange(const std::string&, const std::string& record,
                                                   RankWait wait) override {
    if (broken_) throw std::runtime_error("an earlier all-gather on the process group failed");
    const auto options = at::TensorOptions().dtype(at::kByte).device(
        group_->getBackendName() == "nccl" ? at::Device(at::kCUDA) : at::Device(at::kCPU));
    // A length, then the bytes: every rank's buffer has the same size, as the collective requires.
    std::vector<uint8_t> buffer(kSlot, 0);
    const uint32_t n = static_cast<uint32_t>(std::min(record.size(), kSlot - 4));
    std::memcpy(buffer.data(), &n, 4);
    std::memcpy(buffer.data() + 4, record.data(), n);
    at::Tensor mine = at::empty({static_cast<int64_t>(kSlot)}, at::TensorOptions().dtype(at::kByte));
    std::memcpy(mine.data_ptr(), buffer.data(), kSlot);
    mine = mine.to(options.device());
    std::vector<std::vector<at::Tensor>> gathered(1);
    for (int i = 0; i < group_->getSize(); ++i) gathered[0].push_back(at::zeros({static_cast<int64_t>(kSlot)}, options));
    std::vector<at::Tensor> inputs{mine};
    c10::intrusive_ptr<c10d::Work> work;
    try {
      work = group_->allgather(gathered, inputs);
      // A collective cannot tell a slow rank from a dead one: it waits the longest.
      if (!completes_within(*work, wait.longest)) {
        // The backend may still write into these tensors later: they must outlive this call.
        abandoned_.push_back(Abandoned{work, std::move(gathered), std::move(inputs)});
        throw std::runtime_error(fmt::format(
            "the all-gather did not complete in {:g} s: a rank is gone or no longer takes part",
            std::chrono::duration<double>(wait.longest).count()));
      }
      work->wait(wait.longest);  // raises the collective's own error; on CUDA, orders the stream
    } catch (...) {
      broken_ = true;  // the ranks' collectives no longer line up: never call it again
      throw;
    }
    std::vector<std::optional<std::string>> out;
    for (const auto& t : gathered[0]) {
      const at::Tensor host = t.cpu().contiguous();
      const auto* p = host.data_ptr<uint8_t>();
      uint32_t len = 0;
      std::memcpy(&len, p, 4);
      if (len > kSlot - 4) {
        out.emplace_back(std::string("unreadable"));
        continue;
      }
      out.emplace_back(std::string(reinterpret_cast<const char*>(p) + 4, len));
    }
    return out;
  }

  std::string describe() const override { return "the process group (" + group_->getBackendName() + ")"; }

 private:
  static constexpr size_t kSlot = kMaxRecordBytes + 4;
  struct Abandoned {
    c10::intrusive_ptr<c10d::Work> work;
    std::vector<std::vector<at::Tensor>> outputs;
    std::vector<at::Tensor> inputs;
  };
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  bool broken_ = false;
  std::vector<Abandoned> abandoned_;  // at most one: the channel is not used after it
};

}  // namespace

}  // namespace ranks

std::shared_ptr<RankChannel> group_channel(c10::intrusive_ptr<c10d::ProcessGroup> group) {
  if (!group) throw OptionError("sentinel::group_channel: the process group is null");
  return std::make_shared<ranks::GroupChannel>(std::move(group));
}

}  // namespace sentinel
