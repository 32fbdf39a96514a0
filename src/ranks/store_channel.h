#pragma once
#include <memory>

namespace sentinel {
class RankChannel;
namespace ranks {
// The channel used when none is given: a client of the c10d store at MASTER_ADDR:MASTER_PORT,
// connected at the first exchange.
std::shared_ptr<RankChannel> default_channel();
}  // namespace ranks
}  // namespace sentinel
