#pragma once
// Interned strings: frames store 32-bit ids; the text is needed only when a report is rendered.
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <unordered_map>

namespace sentinel {
namespace frames {

class StringTable {
 public:
  StringTable() { intern(""); }
  uint32_t intern(std::string_view s) {
    auto it = ids_.find(s);
    if (it != ids_.end()) return it->second;
    strings_.emplace_back(s);  // a deque never moves its elements: the view key stays valid
    auto id = static_cast<uint32_t>(strings_.size() - 1);
    ids_.emplace(strings_.back(), id);
    return id;
  }
  const std::string& at(uint32_t id) const { return strings_.at(id); }

 private:
  std::deque<std::string> strings_;
  std::unordered_map<std::string_view, uint32_t> ids_;
};

// A place is where a frame happened: module path + class name.
class PlaceTable {
 public:
  uint32_t intern(const std::string& path, const std::string& cls) {
    return static_cast<uint32_t>(keys_.intern(path + '\n' + cls));
  }
  std::string path(uint32_t id) const { const auto& k = keys_.at(id); return k.substr(0, k.find('\n')); }
  std::string cls(uint32_t id) const {
    const auto& k = keys_.at(id);
    auto nl = k.find('\n');
    return nl == std::string::npos ? std::string() : k.substr(nl + 1);
  }

 private:
  StringTable keys_;
};

}  // namespace frames
}  // namespace sentinel
