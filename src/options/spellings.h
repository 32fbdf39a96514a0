#pragma once
// The names every enum of the options is read by, in one place: the YAML config, Python and the
// command line compare them case-insensitively. A value's first name is the one it is written
// with; the others are older or other tools' spellings, still read.
#include <sentinel/options.h>

#include <string>
#include <string_view>
#include <vector>

#include "options/option_value.h"

namespace sentinel::options {

template <class E>
struct Spelling {
  std::string_view name;
  E value;
};

inline constexpr Spelling<Action> kActions[] = {
    {"throw", Action::Throw}, {"raise", Action::Throw}, {"abort", Action::Abort},
    {"warn", Action::Warn},   {"callback", Action::Callback}};
inline constexpr Spelling<fp8::FormatPolicy> kFormats[] = {
    {"hybrid", fp8::FormatPolicy::HYBRID}, {"e4m3", fp8::FormatPolicy::E4M3}, {"e5m2", fp8::FormatPolicy::E5M2}};
inline constexpr Spelling<fp8::AmaxAlgo> kAmaxAlgos[] = {{"max", fp8::AmaxAlgo::Max},
                                                         {"most_recent", fp8::AmaxAlgo::MostRecent}};
// A recipe's, an MX rule's and a role's own name is the one reports write (<sentinel/fp8_types.h>).
template <class E, const char* (*name_of)(E)>
constexpr Spelling<E> named(E value) {
  return {name_of(value), value};
}
inline constexpr Spelling<fp8::ScalingRecipe> kRecipes[] = {
    named<fp8::ScalingRecipe, fp8::recipe_name>(fp8::ScalingRecipe::Delayed),
    named<fp8::ScalingRecipe, fp8::recipe_name>(fp8::ScalingRecipe::Current),
    named<fp8::ScalingRecipe, fp8::recipe_name>(fp8::ScalingRecipe::MXFP8),
    named<fp8::ScalingRecipe, fp8::recipe_name>(fp8::ScalingRecipe::NVFP4),
    named<fp8::ScalingRecipe, fp8::recipe_name>(fp8::ScalingRecipe::Float8Block),
    {"float8blockscaling", fp8::ScalingRecipe::Float8Block},
    {"float8_block", fp8::ScalingRecipe::Float8Block}};
inline constexpr Spelling<fp8::MxScaleRule> kMxScaleRules[] = {
    named<fp8::MxScaleRule, fp8::mx_scale_rule_name>(fp8::MxScaleRule::RoundUp),
    named<fp8::MxScaleRule, fp8::mx_scale_rule_name>(fp8::MxScaleRule::OcpFloor)};
inline constexpr Spelling<fp8::Role> kRoles[] = {named<fp8::Role, fp8::role_name>(fp8::Role::Activation),
                                                 named<fp8::Role, fp8::role_name>(fp8::Role::Gradient),
                                                 named<fp8::Role, fp8::role_name>(fp8::Role::Weight)};
inline constexpr Spelling<Stat> kStats[] = {
    {"min", Stat::Min},
    {"max", Stat::Max},
    {"mean", Stat::Mean},
    {"std", Stat::Std},
    {"l1_norm", Stat::L1Norm},
    {"l2_norm", Stat::L2Norm},
    {"cur_amax", Stat::CurAmax},
    {"dynamic_range", Stat::DynamicRange},
    {"underflows", Stat::Underflows},
    {"overflows", Stat::Overflows},
    {"max_blockwise_dynamic_range", Stat::MaxBlockwiseDynamicRange}};
// The loggers that write under log_dir.
inline constexpr std::string_view kLoggers[] = {"file", "jsonl", "tensorboard"};

// The names of a list, for Value::choice and for messages.
template <class E, size_t N>
std::vector<std::string_view> names_of(const Spelling<E> (&spellings)[N]) {
  std::vector<std::string_view> names;
  for (const auto& s : spellings) names.push_back(s.name);
  return names;
}

// The value a Value names.
template <class E, size_t N>
E choose(const Value& v, const Spelling<E> (&spellings)[N]) {
  return spellings[v.choice(names_of(spellings))].value;
}

// The first (written) name of a value.
template <class E, size_t N>
std::string_view name_of(E value, const Spelling<E> (&spellings)[N]) {
  for (const auto& s : spellings) {
    if (s.value == value) return s.name;
  }
  return "unknown";
}

// "a, b, c": every name read, for the docs.
template <class E, size_t N>
std::string all_names(const Spelling<E> (&spellings)[N]) {
  std::string out;
  for (const auto& s : spellings) out += (out.empty() ? "" : ", ") + std::string(s.name);
  return out;
}

}  // namespace sentinel::options
