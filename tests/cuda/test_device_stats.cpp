// The CUDA kernels against the CPU pass (itself checked against float64 oracles): the same
// statistics bit for bit, the same FP8 probe counts, sums to float64 tolerance. Every test that
// needs a GPU skips without one; argument validation runs everywhere.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sentinel/errors.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "cuda/device_stats.h"
#include "fp8/fp8_probe.h"
#include "stats/tensor_stats.h"
#include "support/expect_stats.h"

namespace {

using sentinel::cuda::DeviceSlot;
using sentinel::cuda::DType;
using sentinel::fp8::Format;
namespace stats = sentinel::stats;
using sentinel_test::expect_same_stats;

#define SKIP_WITHOUT_GPU()                                         \
  do {                                                             \
    std::string why;                                               \
    if (!sentinel::cuda::device_available(&why)) GTEST_SKIP() << why; \
  } while (0)

void ok(cudaError_t e) { ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e); }

// Device copy of a CPU tensor's bytes, `offset_bytes` past an aligned allocation (to exercise
// the kernel's unaligned path).
struct DeviceCopy {
  void* base = nullptr;
  void* data = nullptr;
  DeviceCopy(const torch::Tensor& t, size_t offset_bytes = 0) {
    auto c = t.contiguous();
    ok(cudaMalloc(&base, c.nbytes() + offset_bytes + 16));
    data = static_cast<char*>(base) + offset_bytes;
    ok(cudaMemcpy(data, c.data_ptr(), c.nbytes(), cudaMemcpyHostToDevice));
  }
  ~DeviceCopy() { cudaFree(base); }
};

DType dtype_of(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kHalf: return DType::kFloat16;
    case torch::kBFloat16: return DType::kBFloat16;
    default: return DType::kFloat32;
  }
}

DeviceSlot run(const void* data, int64_t numel, DType dtype, const stats::Fp8ProbeParams* probe,
               cudaStream_t stream = nullptr) {
  DeviceSlot* slot = nullptr;
  EXPECT_EQ(cudaMalloc(&slot, sizeof(DeviceSlot)), cudaSuccess);
  sentinel::cuda::reduce_into_slot(data, numel, dtype, slot, probe, stream);
  DeviceSlot host;
  EXPECT_EQ(cudaMemcpyAsync(&host, slot, sizeof host, cudaMemcpyDeviceToHost, stream), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaFree(slot);
  return host;
}

torch::Tensor oracle_suite(int64_t n) {
  torch::manual_seed(21);
  auto t = torch::randn({n}) * torch::pow(10.0, torch::randint(-9, 6, {n}).to(torch::kFloat));
  if (n > 12) {
    t[3] = 0.0f;
    t[4] = -0.0f;
    t[5] = std::numeric_limits<float>::infinity();
    t[6] = -std::numeric_limits<float>::infinity();
    t[7] = std::nanf("");
    t[8] = 1e-40f;
    t[9] = 448.0f;
    t[10] = 464.0f;  // E4M3's first overflow at scale 1
  }
  return t;
}

TEST(CudaKernels, StatisticsEqualTheCpuPassForEveryDtypeSizeAndAlignment) {
  SKIP_WITHOUT_GPU();
  for (auto dtype : {torch::kFloat, torch::kHalf, torch::kBFloat16}) {
    for (int64_t n : {1, 7, 31, 4096 + 5, 1 << 20}) {
      const auto t = oracle_suite(n).to(dtype);
      sentinel::TensorStats want;
      stats::compute(t, want);
      for (size_t offset : {size_t{0}, static_cast<size_t>(t.element_size())}) {
        DeviceCopy d(t, offset);
        const auto got = sentinel::cuda::decode_stats(run(d.data, n, dtype_of(t), nullptr));
        SCOPED_TRACE(std::string(c10::toString(dtype)) + " n=" + std::to_string(n) + " offset=" + std::to_string(offset));
        expect_same_stats(got, want);
      }
    }
  }
}

// Tensors of ordinary numbers take the kernel's integer fast path, vector by vector; a vector
// holding a special value (NaN, an infinity, a zero, a subnormal) goes through the accumulators.
// Each special value is planted alone, inside the tensor and at its last element (in the
// unrolled loads, the one-at-a-time loads or the tail, by size).
TEST(CudaKernels, OrdinaryVectorsTakeTheFastPathAndOneSpecialValueAnywhereIsCounted) {
  SKIP_WITHOUT_GPU();
  const float specials[] = {std::nanf(""), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), 0.0f, -0.0f, 1e-40f, 3e-6f};
  for (auto dtype : {torch::kFloat, torch::kHalf, torch::kBFloat16}) {
    for (int64_t n : {int64_t{40}, int64_t{1} << 16, (int64_t{1} << 22) + 3}) {
      torch::manual_seed(n);
      // |x| in [0.5, 2): normal in every dtype, so only the planted value is special.
      const auto ordinary = (torch::rand({n}) * 1.5 + 0.5) * (torch::randint(0, 2, {n}) * 2 - 1);
      std::vector<torch::Tensor> cases = {ordinary.to(dtype)};
      for (int64_t at : {n / 3, n - 1}) {
        for (float special : specials) {
          auto t = ordinary.clone();
          t[at] = special;
          cases.push_back(t.to(dtype));
        }
      }
      for (const auto& t : cases) {
        sentinel::TensorStats want;
        stats::compute(t, want);
        DeviceCopy d(t);
        const auto got = sentinel::cuda::decode_stats(run(d.data, n, dtype_of(t), nullptr));
        SCOPED_TRACE(std::string(c10::toString(dtype)) + " n=" + std::to_string(n));
        expect_same_stats(got, want);
      }
    }
  }
}

TEST(CudaKernels, EmptyTensorGivesAnEmptySlot) {
  SKIP_WITHOUT_GPU();
  const auto got = sentinel::cuda::decode_stats(run(nullptr, 0, DType::kFloat32, nullptr));
  EXPECT_EQ(got.count, 0);
  EXPECT_EQ(got.abs_max, 0.0);
  EXPECT_EQ(got.abs_min, std::numeric_limits<double>::infinity());
}

TEST(CudaKernels, Float8TensorsDecodeAsCudaCastsDefineThem) {
  SKIP_WITHOUT_GPU();
  for (Format f : {Format::E4M3, Format::E5M2}) {
    std::vector<uint8_t> codes;
    for (int rep = 0; rep < 37; ++rep) {
      for (int c = 0; c < 256; ++c) codes.push_back(static_cast<uint8_t>(c));
    }
    // Oracle: every code decoded on the host (fp8::decode is bit-exact with cuda_fp8.h).
    sentinel::TensorStats want;
    std::vector<float> decoded;
    for (uint8_t c : codes) decoded.push_back(sentinel::fp8::decode(c, f));
    stats::compute(torch::from_blob(decoded.data(), {static_cast<int64_t>(decoded.size())}), want);
    // float8 has its own smallest normal: the CPU pass on float32 counts float's subnormals.
    want.subnormal = 0;
    for (float v : decoded) want.subnormal += std::fabs(v) > 0 && std::fabs(v) < sentinel::fp8::min_normal(f);
    auto bytes = torch::from_blob(codes.data(), {static_cast<int64_t>(codes.size())}, torch::kUInt8).clone();
    DeviceCopy d(bytes, 3);
    const auto got = sentinel::cuda::decode_stats(run(d.data, bytes.numel(),
                                                      f == Format::E4M3 ? DType::kFloat8E4M3 : DType::kFloat8E5M2, nullptr));
    expect_same_stats(got, want);
  }
}

TEST(CudaKernels, Fp8ProbeEqualsTheCpuProbe) {
  SKIP_WITHOUT_GPU();
  for (auto dtype : {torch::kFloat, torch::kHalf, torch::kBFloat16}) {
    const auto t = oracle_suite(300001).to(dtype);
    for (Format f : {Format::E4M3, Format::E5M2}) {
      for (float scale : {1.0f, 448.0f / 3.0f, 0.37f}) {
        sentinel::TensorStats s;
        stats::Fp8ProbeResult want;
        ASSERT_TRUE(stats::compute_with_fp8_probe(t, scale, f, s, want));
        const auto params = stats::make_fp8_probe_params(scale, f);
        DeviceCopy d(t);
        const DeviceSlot slot = run(d.data, t.numel(), dtype_of(t), &params);
        const auto got = sentinel::cuda::decode_probe(slot, scale);
        expect_same_stats(sentinel::cuda::decode_stats(slot), s);
        EXPECT_EQ(got.count, want.count);
        EXPECT_EQ(got.overflow, want.overflow);
        EXPECT_EQ(got.underflow, want.underflow);
        EXPECT_NEAR(got.mse(), want.mse(), 1e-5 * want.mse());
        EXPECT_NEAR(got.cosine(), want.cosine(), 1e-7);
        EXPECT_NEAR(got.sqnr_db(), want.sqnr_db(), 1e-4);
      }
    }
  }
}

TEST(CudaKernels, RingReadsBackAcrossItsEndAfterOneWait) {
  SKIP_WITHOUT_GPU();
  sentinel::cuda::DeviceRing ring(4, 0);
  cudaStream_t stream;
  ok(cudaStreamCreate(&stream));
  std::vector<torch::Tensor> tensors;
  std::vector<std::unique_ptr<DeviceCopy>> copies;
  for (int i = 0; i < 6; ++i) {  // slots 2..5 wrap around a ring of 4
    tensors.push_back(torch::full({1000 + i}, static_cast<float>(i + 1)));
    copies.push_back(std::make_unique<DeviceCopy>(tensors.back()));
    sentinel::cuda::reduce_into_slot(copies.back()->data, tensors.back().numel(), DType::kFloat32,
                                     ring.device_slot(i), nullptr, stream);
  }
  ring.copy_back_async(2, 4, stream);
  for (int i = 2; i < 6; ++i) {
    const auto s = sentinel::cuda::decode_stats(ring.wait_and_read(i));
    EXPECT_EQ(s.count, 1000 + i);
    EXPECT_EQ(s.abs_max, i + 1);
  }
  cudaStreamDestroy(stream);
}

// Many tensors in few launches: 200 of every size class (empty, a few elements, unaligned,
// larger than a block's pass), more than one launch holds, each into its own slot but every fifth
// into one slot they share; each slot equals the CPU pass over its tensors (the shared one over
// their concatenation).
TEST(CudaKernels, ManyTensorsInOneLaunchEachEqualTheCpuPass) {
  SKIP_WITHOUT_GPU();
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    torch::manual_seed(23);
    const int64_t sizes[] = {0, 1, 7, 33, 4096 + 5, 70000};
    std::vector<torch::Tensor> tensors;
    std::vector<std::unique_ptr<DeviceCopy>> copies;
    for (int i = 0; i < 200; ++i) {
      tensors.push_back(oracle_suite(sizes[i % 6] + i).to(dtype));
      copies.push_back(std::make_unique<DeviceCopy>(tensors.back(), i % 3 == 0 ? tensors.back().element_size() : 0));
    }
    DeviceSlot* slots = nullptr;
    ok(cudaMalloc(&slots, sizeof(DeviceSlot) * tensors.size()));
    ok(cudaMemset(slots, 0, sizeof(DeviceSlot) * tensors.size()));
    std::vector<sentinel::cuda::TensorSpan> spans;
    std::vector<torch::Tensor> shared;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const bool in_shared = i % 5 == 4;
      if (in_shared) shared.push_back(tensors[i]);
      spans.push_back({copies[i]->data, tensors[i].numel(), slots + (in_shared ? 4 : i)});
    }
    sentinel::cuda::reduce_many_into_slots(spans.data(), static_cast<int64_t>(spans.size()), dtype_of(tensors[0]), nullptr);
    std::vector<DeviceSlot> host(tensors.size());
    ok(cudaMemcpy(host.data(), slots, sizeof(DeviceSlot) * host.size(), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (i % 5 == 4) continue;
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " tensor " + std::to_string(i));
      sentinel::TensorStats want;
      stats::compute(tensors[i], want);
      expect_same_stats(sentinel::cuda::decode_stats(host[i]), want);
    }
    sentinel::TensorStats want;
    stats::compute(torch::cat(shared), want);
    expect_same_stats(sentinel::cuda::decode_stats(host[4]), want);
    cudaFree(slots);
  }
}

TEST(CudaKernels, ManyTensorsWithABadOneAreRefusedBeforeAnyLaunch) {
  DeviceSlot slot{};
  const float data[4] = {1, 2, 3, 4};
  const sentinel::cuda::TensorSpan spans[] = {{data, 4, &slot}, {data, 4, nullptr}};
  try {
    sentinel::cuda::reduce_many_into_slots(spans, 2, DType::kFloat32, nullptr);
    FAIL() << "a tensor without a slot was accepted";
  } catch (const sentinel::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 1 of reduce_many_into_slots has no result slot"), std::string::npos)
        << e.what();
  }
}

TEST(CudaKernels, LaunchesWorkUnderCudaGraphCapture) {
  SKIP_WITHOUT_GPU();
  cudaStream_t stream;
  ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const auto t = oracle_suite(100000);
  DeviceCopy d(t);
  DeviceSlot* slot = nullptr;
  ok(cudaMalloc(&slot, sizeof(DeviceSlot)));
  const auto params = stats::make_fp8_probe_params(2.0f, Format::E4M3);
  cudaGraph_t graph;
  ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  sentinel::cuda::reduce_into_slot(d.data, t.numel(), DType::kFloat32, slot, &params, stream);
  ok(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  ok(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) ok(cudaGraphLaunch(exec, stream));  // the memset node resets it
  DeviceSlot host;
  ok(cudaMemcpyAsync(&host, slot, sizeof host, cudaMemcpyDeviceToHost, stream));
  ok(cudaStreamSynchronize(stream));
  sentinel::TensorStats want;
  stats::compute(t, want);
  expect_same_stats(sentinel::cuda::decode_stats(host), want);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaFree(slot);
  cudaStreamDestroy(stream);
}

// Validation happens before any CUDA call: these run with or without a GPU.
TEST(CudaKernels, BadArgumentsAreNamedBeforeAnyLaunch) {
  DeviceSlot* fake = reinterpret_cast<DeviceSlot*>(uintptr_t{64});
  const auto params = stats::make_fp8_probe_params(1.0f, Format::E4M3);
  auto message = [](auto&& call) {
    try {
      call();
    } catch (const sentinel::InputError& e) {
      return std::string(e.what());
    }
    return std::string("no InputError");
  };
  EXPECT_NE(message([&] { sentinel::cuda::reduce_into_slot(fake, 4, DType::kFloat32, nullptr, nullptr, nullptr); })
                .find("null pointer"),
            std::string::npos);
  EXPECT_NE(message([&] { sentinel::cuda::reduce_into_slot(fake, -1, DType::kFloat32, fake, nullptr, nullptr); })
                .find("numel >= 0, got -1"),
            std::string::npos);
  EXPECT_NE(message([&] { sentinel::cuda::reduce_into_slot(nullptr, 4, DType::kFloat32, fake, nullptr, nullptr); })
                .find("null data pointer"),
            std::string::npos);
  const void* odd = reinterpret_cast<const void*>(uintptr_t{66});
  EXPECT_NE(message([&] { sentinel::cuda::reduce_into_slot(odd, 4, DType::kFloat32, fake, nullptr, nullptr); })
                .find("float32 pointer not aligned"),
            std::string::npos);
  EXPECT_NE(message([&] { sentinel::cuda::reduce_into_slot(fake, 4, DType::kFloat8E5M2, fake, &params, nullptr); })
                .find("got float8_e5m2"),
            std::string::npos);
}

}  // namespace
