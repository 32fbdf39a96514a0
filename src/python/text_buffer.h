#pragma once
// Where a watchdog made from Python writes its text (reports, trace lines, FP8 alarms). The
// watchdog writes from inside LibTorch's op callbacks, where taking the GIL to call
// sys.stdout.write would cost every op the risk of waiting on Python; the text is kept here
// instead and the Python side prints it at its next hook (a module's end, the batch's end, an
// exception), in order, through sys.stdout.
#include <atomic>
#include <mutex>
#include <streambuf>
#include <string>

namespace sentinel {
namespace python {

class TextBuffer : public std::streambuf {
 public:
  // Everything written since the last take.
  std::string take() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::string out;
    out.swap(text_);
    waiting_.store(false, std::memory_order_relaxed);
    return out;
  }
  // Whether take() would return something: read without the lock at every module's end.
  bool waiting() const { return waiting_.load(std::memory_order_relaxed); }

 protected:
  int_type overflow(int_type c) override {
    if (c != traits_type::eof()) {
      std::lock_guard<std::mutex> lock(mutex_);
      text_.push_back(static_cast<char>(c));
      waiting_.store(true, std::memory_order_relaxed);
    }
    return traits_type::not_eof(c);
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    std::lock_guard<std::mutex> lock(mutex_);
    text_.append(s, static_cast<size_t>(n));
    waiting_.store(true, std::memory_order_relaxed);
    return n;
  }

 private:
  std::mutex mutex_;
  std::string text_;
  std::atomic<bool> waiting_{false};
};

}  // namespace python
}  // namespace sentinel
