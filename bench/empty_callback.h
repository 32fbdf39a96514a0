#pragma once
// A RecordFunction callback of this thread that does nothing but count the events it sees, with
// the watchdog's scopes: LibTorch's own price for calling one, with every op's arguments and
// results boxed for it (as the watchdog asks) or not. Against an unwatched and a watched step it
// splits the watched step's host cost between LibTorch's event machinery and the watchdog's work.
//
// RecordFunction has a member only without NDEBUG, and LibTorch is built with it: the header is
// read as LibTorch was built (as src/capture/record_hooks.cpp does).
#ifndef NDEBUG
#define NDEBUG
#define BENCH_RESTORE_ASSERTS
#endif
#include <ATen/record_function.h>
#ifdef BENCH_RESTORE_ASSERTS
#undef NDEBUG
#undef BENCH_RESTORE_ASSERTS
#endif

#include <atomic>
#include <cstdint>
#include <memory>

namespace bench {

class EmptyCallback {
 public:
  explicit EmptyCallback(bool boxed) {
    events() = 0;
    handle_ = at::addThreadLocalCallback(
        at::RecordFunctionCallback(
            [](const at::RecordFunction&) -> std::unique_ptr<at::ObserverContext> {
              ++events();
              return nullptr;
            },
            [](const at::RecordFunction&, at::ObserverContext*) {})
            .needsInputs(boxed)
            .needsOutputs(boxed)
            .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                     at::RecordScope::TORCHSCRIPT_FUNCTION, at::RecordScope::USER_SCOPE}));
  }
  ~EmptyCallback() { at::removeCallback(handle_); }
  EmptyCallback(const EmptyCallback&) = delete;
  EmptyCallback& operator=(const EmptyCallback&) = delete;

  // Events seen since the callback was added, on every thread that ran under it (autograd's
  // device threads inherit it with the rest of the thread's state).
  static std::atomic<int64_t>& events() {
    static std::atomic<int64_t> count{0};
    return count;
  }

 private:
  at::CallbackHandle handle_;
};

}  // namespace bench
