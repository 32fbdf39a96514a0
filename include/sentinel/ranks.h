#pragma once
// The channel through which the ranks exchange their records, made from the user's own c10d
// objects. Without one, the watchdog connects to the store at MASTER_ADDR:MASTER_PORT.
//
//   auto store = c10::make_intrusive<c10d::TCPStore>(addr, store_options);
//   sentinel::Options().ranks(sentinel::RankOptions().channel(sentinel::store_channel(store)));
#include <c10/util/intrusive_ptr.h>

#include <memory>

namespace c10d {
class Store;
class ProcessGroup;
}  // namespace c10d

namespace sentinel {

class RankChannel;

// Records go through the store (keys under "sentinel/"): each rank's answer, or its absence, is
// seen on its own, so the ranks that did not answer are named, and a dead rank breaks nothing.
std::shared_ptr<RankChannel> store_channel(c10::intrusive_ptr<c10d::Store> store);

// Records go through an all-gather on the group (Gloo: a CPU tensor; NCCL: one on the current
// CUDA device). Every rank must reach the same exchanges; if a rank dies the collective fails as a
// whole, so the ranks that did not answer cannot be named, and the group is not used again.
// The group also gives the rank and world size.
std::shared_ptr<RankChannel> group_channel(c10::intrusive_ptr<c10d::ProcessGroup> group);

}  // namespace sentinel
