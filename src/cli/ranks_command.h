#pragma once
// `sentinel ranks DIR`: one summary of the reports that the ranks of a run wrote into DIR/rank<R>/.
#include <iosfwd>
#include <string>

namespace sentinel {
namespace cli {

// Prints the summary; returns 3 when a rank tripped, 0 when none did, 4 when DIR holds no ranks'
// reports directory at all.
int summarize_ranks(const std::string& dir, std::ostream& out, std::ostream& err);

}  // namespace cli
}  // namespace sentinel
