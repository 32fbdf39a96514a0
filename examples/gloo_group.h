// A c10d process group on Gloo, from a store, in the shape each LibTorch generation wants: up to
// 1.13 ProcessGroupGloo is itself the process group; from 2.0 it is a backend that a ProcessGroup
// holds for CPU tensors.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/version.h>

#include <chrono>
#include <type_traits>

namespace sentinel_examples {

#if TORCH_VERSION_MAJOR >= 2
namespace detail {
// The ProcessGroup's constructor lost its options argument during 2.x; a template, so that only
// the form this LibTorch has is compiled.
template <typename Group>
c10::intrusive_ptr<Group> make_bare_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world) {
  if constexpr (std::is_constructible_v<Group, c10::intrusive_ptr<c10d::Store>, int, int>) {
    return c10::make_intrusive<Group>(store, rank, world);
  } else {
    return c10::make_intrusive<Group>(store, rank, world, c10::make_intrusive<typename Group::Options>("gloo"));
  }
}
}  // namespace detail
#endif

inline c10::intrusive_ptr<c10d::ProcessGroup> gloo_group(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                         int world, std::chrono::seconds timeout) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, options);
#if TORCH_VERSION_MAJOR >= 2
  auto group = detail::make_bare_group<c10d::ProcessGroup>(store, rank, world);
  group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO,
                    c10::intrusive_ptr<c10d::Backend>(gloo));
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  return group;
#else
  return gloo;
#endif
}

}  // namespace sentinel_examples
