#pragma once
// An OptionError about one option, named by its path ("fp8.margin", "trace_batch_nums[1]"):
// Options::validate() throws it, and a front end that knows where that option was written (a
// config's line) says so.
#include <sentinel/errors.h>

#include <string>
#include <utility>

namespace sentinel::options {

class FieldError : public OptionError {
 public:
  // what() is "sentinel: <detail>"; a front end that names the place itself uses detail().
  FieldError(std::string path, std::string detail)
      : OptionError("sentinel: " + detail), path_(std::move(path)), detail_(std::move(detail)) {}
  const std::string& path() const noexcept { return path_; }
  const std::string& detail() const noexcept { return detail_; }

 private:
  std::string path_;
  std::string detail_;
};

// The entry of `written` (a map keyed by option paths) for `path` or, when the front end did not
// write that option itself, for the nearest section around it: "fp8.recipes[1]", then
// "fp8.recipes", then "fp8". end() when there is none.
template <class Map>
typename Map::const_iterator nearest_written(const Map& written, std::string path) {
  while (!path.empty()) {
    if (auto it = written.find(path); it != written.end()) return it;
    const size_t cut = path.find_last_of(".[");
    path = cut == std::string::npos ? std::string() : path.substr(0, cut);
  }
  return written.end();
}

}  // namespace sentinel::options
