#pragma once
// The training loop's window (Watchdog::watch_loop_ops): in a batch that watches no op, the ops the
// loop runs between the backward's end and the optimizer's step (clipping, unscaling) are watched.
// It opens inside the autograd engine's final callback, whose thread-local RecordFunction state is
// dropped when backward() returns, so the window's callback is a global one: other threads' ops
// find no batch of theirs and return, and a thread with its own callback is watched by that one.
#include <memory>

#include "capture/session.h"

namespace sentinel {
namespace capture {

// `anchor`'s batch watches this thread's ops until close_loop_window; false when it already does.
bool open_loop_window(const std::shared_ptr<SessionAnchor>& anchor);
void close_loop_window(const SessionAnchor* anchor);

}  // namespace capture
}  // namespace sentinel
