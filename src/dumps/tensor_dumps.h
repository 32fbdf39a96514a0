#pragma once
// Tensor dumps: files Python's torch.load opens (Megatron's --save-tensor), and at detection the
// arguments and results of the op that made the inf/nan, which `sentinel replay` re-runs.
#include <sentinel/options.h>

#include <cstdint>
#include <iosfwd>
#include <map>
#include <regex>
#include <string>
#include <vector>

namespace at {
class Tensor;
}
namespace c10 {
struct IValue;
}

namespace sentinel {
namespace dumps {

class TensorDumper {
 public:
  // `log_dir` gives the default directory (<log_dir>/saved_tensors). Throws sentinel::OptionError
  // for an invalid regex or schedule.
  TensorDumper(const DumpOptions& options, const std::string& log_dir);

  bool enabled() const { return enabled_; }
  const std::string& dir() const { return dir_; }
  // Whether this layer's tensors are saved at this step.
  bool wants(int64_t step, const std::string& layer);
  // Saves `t` as <dir>/<layer>.<role>.step<N>.pt (.<k>.pt for the k-th use of a layer in a
  // step). Never throws: a full disk, an unwritable directory or the size cap is said once on
  // `out`, and dumping stops.
  void save(const at::Tensor& t, const std::string& layer, const std::string& role, int64_t step, std::ostream& out);
  int64_t bytes_written() const { return bytes_; }
  int64_t files_written() const { return files_; }

 private:
  DumpOptions options_;
  bool enabled_;
  std::string dir_;
  std::regex layers_;
  std::map<std::string, bool> selected_;
  std::map<std::string, int> uses_;  // file stem -> uses so far in its step
  int64_t step_ = -1;
  int64_t bytes_ = 0;
  int64_t files_ = 0;
  bool dir_made_ = false;
};

// What an op dump holds, as op.json says it.
struct OpDump {
  std::string op;        // "aten::mul"
  std::string overload;  // "Tensor"; "" for none
  std::string module_path;
  int64_t batch = 0;
  bool in_place = false;  // the arguments were written by the op: saved as it left them
};

// Writes <dir>/op.json, <dir>/inputs.pt (a tuple of the op's arguments) and <dir>/outputs.pt
// (a tuple of its results). Returns "" or what went wrong.
std::string save_op_dump(const std::string& dir, const OpDump& op, const std::vector<c10::IValue>& inputs,
                         const std::vector<c10::IValue>& outputs);

// A tensor as torch.save would store it: a view of a larger storage is copied first, so that a
// slice does not carry its whole storage.
std::vector<char> pickle_tensor(const at::Tensor& t);

}  // namespace dumps
}  // namespace sentinel
