#pragma once
// One option's value as a front end holds it: a node of a YAML config, a Python object, a word of
// the command line. The option tables (option_table.h) read every value through this interface,
// so that each option is spelled and set in one place; each front end says in its own words
// (with a line number, a Python TypeError, a flag's name) what was wrong with a value.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sentinel {
class RankChannel;
}

namespace sentinel::options {

class Value;

struct Entry {
  std::string key;  // as written (an older spelling stays as the user wrote it)
  std::unique_ptr<Value> value;
};

enum class ChannelKind { Store, Group };

class Value {
 public:
  virtual ~Value() = default;

  virtual bool is_null() const = 0;
  virtual bool is_boolean() const = 0;
  // Each read throws, naming the value, when the value is not of that kind.
  virtual bool boolean() const = 0;
  virtual int64_t integer() const = 0;
  virtual double number() const = 0;
  virtual std::string text() const = 0;
  // A list's items (a front end may read a single value as a list of one).
  virtual std::vector<std::unique_ptr<Value>> items() const = 0;
  // A mapping's entries in order; a key that is not in `keys` is refused, naming the keys taken.
  virtual std::vector<Entry> entries(const std::vector<std::string_view>& keys) const = 0;
  // The index in `names` of the value, compared case-insensitively; anything else is refused,
  // naming the names.
  virtual size_t choice(const std::vector<std::string_view>& names) const = 0;
  // A layer selection: a regex matched against the whole module path (a config also takes
  // TransformerEngine's layer selection mapping).
  virtual std::string layers() const { return text(); }
  // A torch.distributed Store or process group: only Python has one to give.
  virtual std::shared_ptr<RankChannel> rank_channel(ChannelKind kind) const;

  // The value is of the right kind but not allowed.
  [[noreturn]] virtual void fail(std::string_view message) const = 0;
  // The option this value sets, as Options::validate() names it ("fp8.margin",
  // "trace_batch_nums[1]"): a front end that can point at where the value was written keeps it.
  virtual void set_path(const std::string& path) { path_ = path; }
  const std::string& path() const noexcept { return path_; }

 protected:
  std::string path_;
};

}  // namespace sentinel::options
