#include "core/model_index.h"

#include <torch/csrc/jit/api/module.h>
#include <torch/nn/module.h>

namespace sentinel {
namespace core {

std::string short_class_name(const std::string& qualified) {
  std::string s = qualified;
  auto colons = s.rfind("::");
  if (colons != std::string::npos) s = s.substr(colons + 2);
  auto dot = s.rfind('.');
  if (dot != std::string::npos) s = s.substr(dot + 1);
  const std::string impl = "Impl";
  if (s.size() > impl.size() && s.compare(s.size() - impl.size(), impl.size(), impl) == 0) {
    s.resize(s.size() - impl.size());
  }
  return s;
}

namespace {
std::string jit_class(const torch::jit::Module& m) {
  auto name = m.type()->name();
  return name ? short_class_name(name->name()) : std::string("Module");
}
}  // namespace

ModelIndex::ModelIndex(std::shared_ptr<torch::nn::Module> model, StringTable& strings, PlaceTable& places)
    : cpp_model_(std::move(model)), strings_(strings), places_(places) {
  refresh();  // (no layout indexed yet: indexes)
}

ModelIndex::ModelIndex(const torch::jit::Module& model, StringTable& strings, PlaceTable& places)
    : jit_model_(std::make_unique<torch::jit::Module>(model)), strings_(strings), places_(places) {
  index_torchscript();
}

ModelIndex::~ModelIndex() = default;

bool ModelIndex::is_torchscript() const { return jit_model_ != nullptr; }

namespace {
// A module's own parameters, read in place: named_parameters() copies them into a new dictionary.
struct ParametersOf : torch::nn::Module {
  static const torch::OrderedDict<std::string, at::Tensor>& of(const torch::nn::Module& m) {
    return m.*(&ParametersOf::parameters_);
  }
};
}  // namespace

void ModelIndex::collect_layout(const torch::nn::Module& module, std::vector<uintptr_t>& out) {
  const std::hash<std::string> hash;
  out.push_back(reinterpret_cast<uintptr_t>(&module));
  out.push_back(hash(module.name()));  // (a module made where a freed one was is another class)
  const auto& parameters = ParametersOf::of(module);
  out.push_back(parameters.size());
  for (const auto& p : parameters) {
    out.push_back(hash(p.key()));
    const at::Tensor& t = p.value();
    out.push_back(reinterpret_cast<uintptr_t>(t.unsafeGetTensorImpl()));
    // (set_() moves a tensor to other memory: its views are found by their storage.)
    out.push_back(t.defined() && t.has_storage() ? reinterpret_cast<uintptr_t>(t.storage().unsafeGetStorageImpl()) : 0);
  }
  const auto children = module.named_children();
  out.push_back(children.size());
  for (const auto& child : children) {
    out.push_back(hash(child.key()));
    collect_layout(*child.value(), out);
  }
}

void ModelIndex::refresh() {
  if (!cpp_model_) return;
  layout_now_.clear();
  collect_layout(*cpp_model_, layout_now_);
  if (layout_now_ == layout_) return;
  index_cpp();
  layout_.swap(layout_now_);  // (only once indexed: an index that threw is rebuilt next time)
}

void ModelIndex::add_param(const at::Tensor& p, uint32_t place, const std::string& name) {
  if (!p.defined()) return;
  ParamRef ref{place, strings_.intern(name)};
  params_.emplace_back(p, ref);
  auto [first, added] = by_impl_.try_emplace(p.unsafeGetTensorImpl(), ref);
  if (!added) {
    // Another module holds this very tensor (tied weights): the first keeps naming it, as HF
    // names a shared module by its first name, and each holder is kept for the op it runs.
    auto& holders = holders_[p.unsafeGetTensorImpl()];
    if (holders.empty()) holders.push_back(first->second);
    holders.push_back(ref);
    first->second.shared = true;
    return;
  }
  if (p.has_storage()) {
    const void* storage = p.storage().unsafeGetStorageImpl();
    // Several parameters in one storage (a flattened buffer): the storage names none of them.
    if (++storage_users_[storage] == 1) by_storage_[storage] = ref;
    else by_storage_.erase(storage);
  }
}

void ModelIndex::index_cpp() {
  params_.clear();
  by_impl_.clear();
  by_storage_.clear();
  holders_.clear();
  storage_users_.clear();
  cpp_module_places_.clear();
  module_paths_.clear();
  for (const auto& item : cpp_model_->named_modules("", /*include_self=*/true)) {
    const auto& module = item.value();
    uint32_t place = places_.intern(item.key(), short_class_name(module->name()));
    module_paths_.push_back(item.key());
    cpp_module_places_[module.get()] = place;
    if (item.key().empty()) root_place_ = place;
    for (const auto& p : module->named_parameters(/*recurse=*/false)) add_param(p.value(), place, p.key());
  }
}

void ModelIndex::index_torchscript() {
  root_place_ = places_.intern("", jit_class(*jit_model_));
  module_paths_.clear();
  for (const auto& item : jit_model_->named_modules()) {
    uint32_t place = places_.intern(item.name, jit_class(item.value));
    module_paths_.push_back(item.name);
    for (const auto& p : item.value.named_parameters(/*recurse=*/false)) add_param(p.value, place, p.name);
  }
}

const ParamRef* ModelIndex::find_param(const at::Tensor& t) const {
  auto it = by_impl_.find(t.unsafeGetTensorImpl());
  if (it != by_impl_.end()) return &it->second;
  if (by_storage_.empty() || !t.has_storage()) return nullptr;
  auto st = by_storage_.find(t.storage().unsafeGetStorageImpl());
  return st == by_storage_.end() ? nullptr : &st->second;
}

const ParamRef* ModelIndex::holder_at(const at::Tensor& t, uint32_t place) const {
  auto it = holders_.find(t.unsafeGetTensorImpl());
  if (it == holders_.end()) return nullptr;
  for (const ParamRef& ref : it->second) {
    if (ref.place == place) return &ref;
  }
  return nullptr;
}

std::optional<uint32_t> ModelIndex::module_place(const torch::nn::Module* m) const {
  auto it = cpp_module_places_.find(m);
  if (it == cpp_module_places_.end()) return std::nullopt;
  return it->second;
}

uint32_t ModelIndex::place_for_hierarchy(const std::vector<std::string>& raw) {
  if (raw.size() <= 1 || !jit_model_) return root_place_;
  // The root entry is skipped: its name changes (a DifferentiableGraph renames it in grad mode).
  std::string key;
  for (size_t i = 1; i < raw.size(); ++i) (key += raw[i]) += '|';
  auto hit = hierarchy_cache_.find(key);
  if (hit != hierarchy_cache_.end()) return hit->second;

  torch::jit::Module current = *jit_model_;
  std::string path;
  std::string leaf_class = jit_class(current);
  for (size_t i = 1; i < raw.size(); ++i) {
    const std::string& entry = raw[i];
    const auto open = entry.find('(');
    const auto close = entry.find(')', open == std::string::npos ? 0 : open);
    const std::string instance = entry.substr(0, open);
    const std::string cls = (open == std::string::npos || close == std::string::npos)
                                ? std::string()
                                : short_class_name(entry.substr(open + 1, close - open - 1));
    // Free functions appear as "::relu" or "(…)" with no instance name: not modules. A method
    // calling another method of its own module (ResNet's forward calling _forward_impl,
    // Conv2d's forward calling _conv_forward) appears as "SELF(Class)": the same module.
    if (open == std::string::npos || instance.empty() || instance == "SELF") continue;
    auto join = [&](const std::string& a) { return path.empty() ? a : path + "." + a; };
    bool found = false;
    for (const auto& child : current.named_children()) {
      if (child.name == instance) {
        path = join(instance);
        current = child.value;
        leaf_class = jit_class(current);
        found = true;
        break;
      }
    }
    // The call stack skips containers: a ModuleList `block` shows its children as `0(Block)`
    // directly under the parent. Look one level down, preferring the matching class.
    for (int pass = 0; pass < 2 && !found; ++pass) {
      for (const auto& container : current.named_children()) {
        for (const auto& child : container.value.named_children()) {
          if (child.name == instance && (pass == 1 || jit_class(child.value) == cls)) {
            path = join(container.name + "." + instance);
            current = child.value;
            leaf_class = jit_class(current);
            found = true;
            break;
          }
        }
        if (found) break;
      }
    }
    if (!found) {  // not in the tree (a scripted free function's module?): keep the raw name
      path = join(instance);
      leaf_class = cls;
    }
  }
  uint32_t place = places_.intern(path, leaf_class);
  hierarchy_cache_.emplace(std::move(key), place);
  return place;
}

}  // namespace core
}  // namespace sentinel
