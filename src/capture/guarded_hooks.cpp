#include "capture/guarded_hooks.h"

#include <cstring>
#include <exception>

namespace sentinel {
namespace capture {

namespace {

const char* what_of(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& error) {
    // The message outlives the handler only as long as the exception: copied into a buffer.
    static thread_local char buffer[512];
    std::strncpy(buffer, error.what(), sizeof buffer - 1);
    buffer[sizeof buffer - 1] = '\0';
    return buffer;
  } catch (...) {
  }
  return "an exception that is not a std::exception";
}

}  // namespace

void report_failure(Session& s, frames::FrameRecord* frame, bool keep_open) {
  const char* what = what_of(std::current_exception());
  if (frame) s.frame_failed(*frame, what, keep_open);
  else s.callback_failed(what);
}

}  // namespace capture
}  // namespace sentinel
