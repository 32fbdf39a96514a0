#pragma once
// Sets the threads of the process's BLAS and ATen's intra-op threads for a scope, and puts back
// what they were: tests that need a core left idle (reads beside ops) or none.
#include <ATen/Context.h>
#include <ATen/Parallel.h>

#include <algorithm>

#include <gtest/gtest.h>

#include "overlap/spare_core.h"

namespace sentinel_test {

// LibTorch's BLAS is either a library whose thread setting is found by name (OpenBLAS, as
// Debian's LibTorch calls it) or linked into LibTorch privately (PyPI's torch: MKL, symbols
// hidden), whose threads follow ATen's: at::set_num_threads sets MKL's too. In the second case
// the scope sets ATen's threads to the larger of the two.
class ScopedComputeThreads {
 public:
  ScopedComputeThreads(int blas, int aten) {
    set_ = reinterpret_cast<Set>(sentinel::overlap::find_blas_function(
        {"openblas_set_num_threads", "mkl_set_num_threads", "bli_thread_set_num_threads"}));
    blas_follows_aten_ = !set_ && at::hasMKL();
    EXPECT_TRUE(set_ || blas_follows_aten_)
        << "the BLAS LibTorch calls has no thread setting found by name, and is not ATen's own MKL";
    aten_before_ = at::get_num_threads();
    if (set_) {
      blas_before_ = sentinel::overlap::core_use().blas_threads;
      set_(blas);
    }
    at::set_num_threads(blas_follows_aten_ ? std::max(blas, aten) : aten);
  }
  ~ScopedComputeThreads() {
    if (set_ && blas_before_ > 0) set_(blas_before_);
    at::set_num_threads(aten_before_);
  }
  ScopedComputeThreads(const ScopedComputeThreads&) = delete;
  ScopedComputeThreads& operator=(const ScopedComputeThreads&) = delete;
  bool blas_found() const { return set_ != nullptr || blas_follows_aten_; }
  // Whether the BLAS's threads are set by its own name (else they follow ATen's).
  bool blas_by_name() const { return set_ != nullptr; }

 private:
  using Set = void (*)(int);
  Set set_ = nullptr;
  bool blas_follows_aten_ = false;
  int blas_before_ = 1;
  int aten_before_ = 1;
};

}  // namespace sentinel_test
