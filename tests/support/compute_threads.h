#pragma once
// Sets the threads of the process's BLAS and ATen's intra-op threads for a scope, and puts back
// what they were: tests that need a core left idle (reads beside ops) or none.
#include <ATen/Parallel.h>

#include <gtest/gtest.h>

#include "overlap/spare_core.h"

namespace sentinel_test {

class ScopedComputeThreads {
 public:
  ScopedComputeThreads(int blas, int aten) {
    set_ = reinterpret_cast<Set>(sentinel::overlap::find_blas_function(
        {"openblas_set_num_threads", "mkl_set_num_threads", "bli_thread_set_num_threads"}));
    EXPECT_TRUE(set_) << "the BLAS LibTorch calls has no thread setting found by name";
    aten_before_ = at::get_num_threads();
    if (set_) {
      blas_before_ = sentinel::overlap::core_use().blas_threads;
      set_(blas);
    }
    at::set_num_threads(aten);
  }
  ~ScopedComputeThreads() {
    if (set_ && blas_before_ > 0) set_(blas_before_);
    at::set_num_threads(aten_before_);
  }
  ScopedComputeThreads(const ScopedComputeThreads&) = delete;
  ScopedComputeThreads& operator=(const ScopedComputeThreads&) = delete;
  bool blas_found() const { return set_ != nullptr; }

 private:
  using Set = void (*)(int);
  Set set_ = nullptr;
  int blas_before_ = 1;
  int aten_before_ = 1;
};

}  // namespace sentinel_test
