#pragma once
// Every option of sentinel::Options and of its sections, once: its name (and the older spellings
// still read), what it takes, its default, what it does and how it is set from a Value. The YAML
// config (`sentinel:`), Python's keyword arguments and the command line's `--set` read options
// only through these tables; the ranges are checked by Options::validate(), which names an
// option by the path these tables give it. `sentinel options` prints them (docs/options.md).
#include <sentinel/options.h>

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "options/option_value.h"

namespace sentinel::options {

template <class Target>
struct Field {
  Field(std::string_view name, std::string takes, std::string default_text, std::string_view help,
        std::function<void(Target&, const Value&)> set, std::vector<std::string_view> aliases = {})
      : name(name), takes(std::move(takes)), default_text(std::move(default_text)), help(help), set(std::move(set)),
        aliases(std::move(aliases)) {}

  std::string_view name;
  std::string takes;  // "an int", "true or false", "one of throw, raise, abort, warn, callback"
  std::string default_text;
  std::string_view help;
  std::function<void(Target&, const Value&)> set;
  std::vector<std::string_view> aliases;  // older spellings, still read
};

template <class Target>
using Table = std::vector<Field<Target>>;

const Table<Options>& option_fields();
const Table<Fp8Options>& fp8_fields();
const Table<fp8::Recipe>& recipe_fields();
const Table<RankOptions>& rank_fields();
const Table<DumpOptions>& dump_fields();
const Table<StatsCollection>& collection_fields();

// Sets on `target` each entry of the mapping `value`, giving each the path of its option
// (`value`'s path, "" at the top level, then the field's name) for validation's messages.
template <class Target>
void apply(Target& target, const Value& value, const Table<Target>& fields);

// The tables as the Markdown of docs/options.md.
std::string options_markdown();

}  // namespace sentinel::options
