#pragma once
// `sentinel replay DUMP`: re-runs the op saved at detection on its saved arguments, on the CPU.
#include <iosfwd>
#include <string>

namespace sentinel {
namespace cli {

// Exit code 3 when the op's results hold inf/nan again (reproduced), 0 when they do not;
// throws sentinel::InputError for a missing or corrupt dump.
int replay_dump(const std::string& dir, std::ostream& out);

}  // namespace cli
}  // namespace sentinel
