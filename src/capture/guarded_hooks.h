#pragma once
// A session's hooks run inside LibTorch's callbacks: what one throws is caught here and handed back
// to its session, never to LibTorch (which would log it and drop the frame).
#include "capture/session.h"

namespace sentinel {
namespace capture {

// Inside a catch: hands what was thrown back to the session, with the frame it concerns.
void report_failure(Session& s, frames::FrameRecord* frame, bool keep_open);

// Runs one session's hook, catching what it throws.
template <typename Hook>
void guarded(Session& s, frames::FrameRecord* frame, bool keep_open, Hook&& hook) {
  try {
    hook();
  } catch (...) {
    report_failure(s, frame, keep_open);
  }
}

}  // namespace capture
}  // namespace sentinel
