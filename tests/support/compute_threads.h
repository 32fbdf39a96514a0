#pragma once
// Sets the threads of the process's BLAS and ATen's intra-op threads for a scope, and puts back
// what they were: tests that need a core left idle (reads beside ops) or none.
#include <ATen/Parallel.h>
#include <dlfcn.h>

#include <gtest/gtest.h>

#include <initializer_list>

namespace sentinel_test {

class ScopedComputeThreads {
 public:
  ScopedComputeThreads(int blas, int aten) {
    get_ = reinterpret_cast<Get>(find({"openblas_get_num_threads", "mkl_get_max_threads", "bli_thread_get_num_threads"}));
    set_ = reinterpret_cast<Set>(find({"openblas_set_num_threads", "mkl_set_num_threads", "bli_thread_set_num_threads"}));
    EXPECT_TRUE(get_ && set_) << "the BLAS LibTorch calls has no thread setting found by name";
    aten_before_ = at::get_num_threads();
    if (get_ && set_) {
      blas_before_ = get_();
      set_(blas);
    }
    at::set_num_threads(aten);
  }
  ~ScopedComputeThreads() {
    if (set_) set_(blas_before_);
    at::set_num_threads(aten_before_);
  }
  ScopedComputeThreads(const ScopedComputeThreads&) = delete;
  ScopedComputeThreads& operator=(const ScopedComputeThreads&) = delete;
  bool blas_found() const { return get_ && set_; }

 private:
  using Get = int (*)();
  using Set = void (*)(int);
  static void* find(std::initializer_list<const char*> names) {
    for (const char* name : names) {
      if (void* f = dlsym(RTLD_DEFAULT, name)) return f;
    }
    if (void* handle = dlopen("libblas.so.3", RTLD_LAZY | RTLD_NOLOAD)) {
      for (const char* name : names) {
        if (void* f = dlsym(handle, name)) return f;
      }
    }
    return nullptr;
  }
  Get get_ = nullptr;
  Set set_ = nullptr;
  int blas_before_ = 1;
  int aten_before_ = 1;
};

}  // namespace sentinel_test
