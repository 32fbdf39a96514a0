#pragma once
// Attribution: which module (path as named_modules() says it, and class) an op belongs to.
// Parameters are found by identity (TensorImpl*), then by storage for views such as weight.t();
// TorchScript module call stacks are mapped back onto the real module tree.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "frames/string_table.h"

namespace at {
class Tensor;
}
namespace torch {
namespace nn {
class Module;
}
namespace jit {
struct Module;
}
}  // namespace torch

namespace sentinel {
namespace core {

using frames::StringTable;
using frames::PlaceTable;

struct ParamRef {
  uint32_t place;  // the owning module: the first in named_modules() order when several hold it
  uint32_t name;   // "weight", in the string table
  bool shared = false;  // other modules hold the same tensor (tied weights): see holder_at
};

// "torch::nn::LinearImpl" -> "Linear"; "__torch__.Block" -> "Block".
std::string short_class_name(const std::string& qualified);

class ModelIndex {
 public:
  ModelIndex(std::shared_ptr<torch::nn::Module> model, StringTable& strings, PlaceTable& places);
  ModelIndex(const torch::jit::Module& model, StringTable& strings, PlaceTable& places);
  ~ModelIndex();

  bool is_torchscript() const;
  // C++-frontend models may gain or swap modules and parameters between batches: re-read them
  // when the tree is no longer the one indexed.
  void refresh();
  const ParamRef* find_param(const at::Tensor& t) const;
  // For a parameter several modules hold (tied embeddings), the module at `place` holding it, so
  // that an op is named by the holder that runs it; nullptr when that module does not hold it.
  const ParamRef* holder_at(const at::Tensor& t, uint32_t place) const;
  // Every parameter with its owner and name, in named_modules() order.
  const std::vector<std::pair<at::Tensor, ParamRef>>& params() const { return params_; }
  uint32_t root_place() const { return root_place_; }
  // Every module's path, in named_modules() order (the root's is "").
  const std::vector<std::string>& module_paths() const { return module_paths_; }
  std::optional<uint32_t> module_place(const torch::nn::Module* m) const;
  // Raw TorchScript hierarchy (entries "name(Class)::method", root first) -> place.
  uint32_t place_for_hierarchy(const std::vector<std::string>& raw);

 private:
  void index_cpp();
  void index_torchscript();
  // The C++ model's tree as it stands: each module, its parameters and its children, by identity
  // and name, in order.
  static void collect_layout(const torch::nn::Module& module, std::vector<uintptr_t>& out);
  void add_param(const at::Tensor& p, uint32_t place, const std::string& name);

  std::shared_ptr<torch::nn::Module> cpp_model_;
  std::unique_ptr<torch::jit::Module> jit_model_;
  StringTable& strings_;
  PlaceTable& places_;
  uint32_t root_place_ = 0;
  std::vector<std::pair<at::Tensor, ParamRef>> params_;
  std::vector<std::string> module_paths_;
  std::unordered_map<const void*, ParamRef> by_impl_;
  std::unordered_map<const void*, ParamRef> by_storage_;
  std::unordered_map<const void*, std::vector<ParamRef>> holders_;  // of the shared parameters only
  std::unordered_map<const void*, int> storage_users_;
  std::unordered_map<const torch::nn::Module*, uint32_t> cpp_module_places_;
  std::unordered_map<std::string, uint32_t> hierarchy_cache_;
  // The layout last indexed (empty before the first), and the one collected to compare with it
  // (kept: no allocation per batch once grown).
  std::vector<uintptr_t> layout_, layout_now_;
};

}  // namespace core
}  // namespace sentinel
