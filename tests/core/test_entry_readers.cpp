// The entry readers on their own: the CPU reader through the batch's cache (and a GEMM operand's
// FP8 probe in the same read), the reader beside an op, the device reader whose entries a
// read-back fills, and the choice among them. No model and no Watchdog; torch's own reductions
// and casts are the oracle.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <limits>
#include <sstream>

#include "core/entry_reader.h"

namespace {

using sentinel::Options;
using sentinel::core::EntryReaders;
using sentinel::core::GemmOperand;
using sentinel::core::ReadContext;
using sentinel::core::ReadRequest;
using sentinel::frames::EntryRecord;
using sentinel::frames::EntryState;
using sentinel::frames::FrameRecord;
using sentinel::frames::Role;

// What the readers share with a watchdog, held by the test instead.
struct Context {
  explicit Context(Options o) : opts(std::move(o.output(out))), observers(opts) {}
  ReadContext get() { return ReadContext{opts, strings, places, observers, counters}; }
  std::ostringstream out;
  Options opts;
  sentinel::frames::StringTable strings;
  sentinel::frames::PlaceTable places;
  sentinel::core::StepObservers observers;
  sentinel::DeviceCounters counters;
};

// The statistics' abs max is over the elements that are not NaN (infinities count).
double abs_max_of(const torch::Tensor& t) {
  auto a = t.to(torch::kDouble).abs();
  return a.masked_select(~torch::isnan(a)).max().item<double>();
}

ReadRequest input(int index = 0) {
  ReadRequest r;
  r.role = Role::Input;
  r.index = index;
  return r;
}

TEST(EntryReaders, TheCpuReaderReadsThroughTheBatchCacheUnlessToldNotToReuse) {
  Context ctx{Options()};
  EntryReaders readers(ctx.get());
  FrameRecord f;
  auto x = torch::tensor({1.0f, std::numeric_limits<float>::quiet_NaN(), 2.5f, -0.5f});
  ASSERT_EQ(&readers.pick(f, x, input()), &readers.cpu);
  EntryRecord e = readers.cpu.read(f, x, input());
  EXPECT_EQ(e.state, EntryState::Read);
  EXPECT_EQ(e.stats.nan, 1);
  EXPECT_EQ(e.stats.abs_max, abs_max_of(x));
  // Memory written behind LibTorch's back (no version bump): the cache still answers, unless the
  // request says the memory may have changed unannounced (a collective, the user's code).
  x.data_ptr<float>()[2] = 7.0f;
  EXPECT_EQ(readers.cpu.read(f, x, input()).stats.abs_max, 2.5);
  ReadRequest fresh = input();
  fresh.reuse_reads = false;
  EXPECT_EQ(readers.cpu.read(f, x, fresh).stats.abs_max, abs_max_of(x));
  // A write LibTorch sees bumps the version: read again.
  x.mul_(2);
  EXPECT_EQ(readers.cpu.read(f, x, input()).stats.abs_max, abs_max_of(x));
}

TEST(EntryReaders, AGemmOperandIsProbedForFp8InTheSameReadAsItsStatistics) {
  Context ctx{Options().fp8(sentinel::Fp8Options().enabled(true))};
  EntryReaders readers(ctx.get());
  FrameRecord f;
  f.place = ctx.places.intern("fc", "Linear");
  f.batch_number = 0;
  auto x = torch::tensor({1000.0f, -500.0f, 3.0f, 1.0f, 0.0005f, 0.0f});
  GemmOperand gemm{sentinel::fp8::Role::Activation, /*probe=*/true, /*collect=*/false};
  ReadRequest r = input();
  r.gemm = &gemm;
  ASSERT_EQ(&readers.pick(f, x, r), &readers.cpu);
  const EntryRecord e = readers.cpu.read(f, x, r);
  EXPECT_EQ(e.stats.abs_max, 1000.0);
  EXPECT_EQ(e.stats.zeros, 1);
  EXPECT_TRUE(ctx.observers.close_step(ctx.places, ""));  // 2 of 6 overflow: an alarm
  ASSERT_EQ(ctx.observers.last_fp8_metrics().size(), 1u);
  const auto& m = ctx.observers.last_fp8_metrics()[0];
  EXPECT_EQ(m.cur_amax, 1000.0);
  EXPECT_EQ(m.count, x.numel());
  // The first step casts at scale 1: torch's own E4M3 cast turns what overflows into NaN, and what
  // underflows into zero.
  const auto cast = x.to(torch::kFloat8_e4m3fn).to(torch::kFloat);
  EXPECT_EQ(m.overflow, cast.isnan().sum().item<int64_t>());
  EXPECT_EQ(m.underflow, ((cast == 0) & (x != 0)).sum().item<int64_t>());
}

TEST(EntryReaders, BesideTheOpOnlyWhatItTakesAndTheEntriesAreFilledWhenCollected) {
  Context ctx{Options()};
  EntryReaders readers(ctx.get());
  FrameRecord f;
  auto big = torch::randn({512, 256});  // 512 KiB: worth a second thread
  big[3][5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(readers.beside.takes(f, big, input()));  // not active: this op's inputs stay here
  readers.beside.set_active(true);
  EXPECT_TRUE(readers.beside.takes(f, big, input()));
  ReadRequest output = input();
  output.role = Role::Output;
  EXPECT_FALSE(readers.beside.takes(f, big, output));  // results are read after the op, here
  ReadRequest headroom = input();
  headroom.headroom = true;
  EXPECT_FALSE(readers.beside.takes(f, big, headroom));
  EXPECT_FALSE(readers.beside.takes(f, torch::ones({4}), input()));  // too small to be worth it
  ASSERT_EQ(&readers.pick(f, big, input()), &readers.beside);

  f.add(readers.beside.read(f, big, input()));
  readers.beside.start(f);
  readers.beside.collect(f);
  readers.beside.set_active(false);
  ASSERT_EQ(f.entry_count, 1);
  EXPECT_EQ(f.entries[0].stats.nan, 1);
  EXPECT_EQ(f.entries[0].stats.abs_max, abs_max_of(big));
  EXPECT_FALSE(f.finite());
  EXPECT_EQ(ctx.counters.tensors_read_beside_ops, 1);
  // What the second thread read is in the batch's cache for the next reader of that memory.
  FrameRecord g;
  EXPECT_EQ(readers.cpu.read(g, big, input()).stats.nan, 1);
}

TEST(EntryReaders, TheDeviceReaderStartsAReductionAndTheReadBackFillsTheWaitingFrame) {
  sentinel::device::set_device_factory_for_testing(sentinel::device::make_cpu_deferred_device);
  struct Restore {
    ~Restore() { sentinel::device::set_device_factory_for_testing(nullptr); }
  } restore;
  Context ctx{Options()};
  EntryReaders readers(ctx.get());
  FrameRecord f;
  auto x = torch::tensor({4.0f, -std::numeric_limits<float>::infinity(), 0.25f});
  ASSERT_EQ(&readers.pick(f, x, input()), &readers.device);
  f.add(readers.device.read(f, x, input()));
  f.add(readers.device.read(f, x, input(1)));  // the same memory, unchanged: the read is reused
  EXPECT_TRUE(f.pending);
  EXPECT_GE(f.entries[0].pending_slot, 0);
  EXPECT_EQ(f.entries[1].pending_slot, f.entries[0].pending_slot);
  EXPECT_EQ(ctx.counters.tensors_read_on_device, 1);
  EXPECT_EQ(ctx.counters.device_reads_reused, 1);
  readers.device.deferred().push(f);
  std::vector<sentinel::frames::FrameRecord> frames(3);  // what a last read-back left: replaced
  readers.device.deferred().resolve(*readers.device.device(), [](const auto&, const auto&) {}, frames);
  ASSERT_EQ(frames.size(), 1u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(frames[0].entries[i].stats.neg_inf, 1);
    EXPECT_EQ(frames[0].entries[i].stats.abs_max, abs_max_of(x));
  }
  EXPECT_FALSE(frames[0].finite());
}

// A device capturing a CUDA graph whenever the test says, counting how often it is asked.
class CapturingDevice final : public sentinel::device::StatsDevice {
 public:
  explicit CapturingDevice(int64_t capacity) : inner_(sentinel::device::make_cpu_deferred_device(capacity)) {}
  bool owns(const at::Tensor& t) const override { return inner_->owns(t); }
  sentinel::stats::Readability readability(const at::Tensor& t) const override { return inner_->readability(t); }
  bool capturing() const override {
    ++asked;
    return capture;
  }
  void enqueue(const at::Tensor& t, int64_t slot, const sentinel::device::Request& r) override {
    inner_->enqueue(t, slot, r);
  }
  void read_back(int64_t first, int64_t end) override { inner_->read_back(first, end); }
  sentinel::device::SlotResult result(int64_t slot) const override { return inner_->result(slot); }
  int64_t capacity() const override { return inner_->capacity(); }
  int64_t synchronisations() const override { return inner_->synchronisations(); }

  static inline bool capture = false;
  static inline int asked = 0;

 private:
  std::unique_ptr<sentinel::device::StatsDevice> inner_;
};

// Whether the stream captures is asked once per frame (a runtime call on a GPU), and a frame
// opened after the capture began, or ended, asks again: inside a capture nothing is enqueued.
TEST(EntryReaders, TheDeviceReaderAsksOncePerFrameWhetherAGraphIsBeingCaptured) {
  sentinel::device::set_device_factory_for_testing(
      [](int64_t capacity) -> std::unique_ptr<sentinel::device::StatsDevice> {
        return std::make_unique<CapturingDevice>(capacity);
      });
  struct Restore {
    ~Restore() { sentinel::device::set_device_factory_for_testing(nullptr); }
  } restore;
  CapturingDevice::capture = false;
  CapturingDevice::asked = 0;
  Context ctx{Options()};
  EntryReaders readers(ctx.get());
  FrameRecord f;
  f.reset();
  const auto a = torch::randn({8});
  const auto b = torch::randn({8});
  ASSERT_EQ(&readers.pick(f, a, input()), &readers.device);
  f.add(readers.device.read(f, a, input()));
  f.add(readers.device.read(f, b, input(1)));
  EXPECT_EQ(CapturingDevice::asked, 1);
  EXPECT_EQ(ctx.counters.tensors_read_on_device, 2);
  readers.device.deferred().push(f);
  std::vector<FrameRecord> frames;
  readers.device.deferred().resolve(*readers.device.device(), [](const auto&, const auto&) {}, frames);

  CapturingDevice::capture = true;  // the next op runs inside a capture
  f.reset();
  const auto c = torch::randn({8});
  const auto d = torch::randn({8});
  f.add(readers.device.read(f, c, input()));
  f.add(readers.device.read(f, d, input(1)));
  EXPECT_EQ(CapturingDevice::asked, 2);
  EXPECT_EQ(ctx.counters.tensors_read_on_device, 2);  // nothing enqueued inside the capture
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(f.entries[i].state, EntryState::Skipped);
    EXPECT_EQ(f.entries[i].skip_reason, static_cast<uint8_t>(sentinel::stats::Readability::CapturedInGraph));
  }
  EXPECT_FALSE(f.pending);
}

}  // namespace
