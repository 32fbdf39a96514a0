// docs/options.md, written from the option tables (`sentinel options` prints it; a test keeps the
// page and the tables equal).
#include <fmt/format.h>

#include "options/option_table.h"

namespace sentinel::options {

namespace {

template <class Target>
void section(std::string& out, std::string_view title, std::string_view intro, const Table<Target>& fields) {
  out += fmt::format("\n## {}\n\n{}\n\n| option | takes | default | what it does |\n|---|---|---|---|\n", title, intro);
  for (const auto& f : fields) {
    std::string name = fmt::format("`{}`", f.name);
    for (const auto alias : f.aliases) name += fmt::format(" (also `{}`)", alias);
    const std::string default_text = f.default_text.empty() ? std::string("") : fmt::format("`{}`", f.default_text);
    out += fmt::format("| {} | {} | {} | {} |\n", name, f.takes, default_text, f.help);
  }
}

}  // namespace

std::string options_markdown() {
  std::string out =
      "# Options\n\n"
      "Written from the option table (`src/options/option_table.cpp`) by `sentinel options`; a test\n"
      "keeps this page and the table equal. Each option has one name everywhere: a key under\n"
      "`sentinel:` in a YAML config ([config.md](config.md)), a keyword argument in Python\n"
      "([python.md](python.md)), `--set NAME=VALUE` on the command line ([cli.md](cli.md)), where a\n"
      "section's field is `--set fp8.recipes=delayed,mxfp8` and a list is comma-separated. Names of\n"
      "values are compared case-insensitively. An older spelling (\"also\") is still read. The ranges\n"
      "are checked when the watchdog starts (`Options::validate()`), naming the option.\n";
  section(out, "The watchdog", "The top level (`sentinel::Options`).", option_fields());
  section(out, "fp8",
          "The FP8 probe (`Fp8Options`; [fp8.md](fp8.md)): `fp8: true`, or a mapping of these fields.", fp8_fields());
  section(out, "ranks", "Many processes (`RankOptions`; [ranks.md](ranks.md)).", rank_fields());
  section(out, "dumps", "Tensor dumps (`DumpOptions`).", dump_fields());
  section(out, "stats_collections",
          "Each collection of statistics (`StatsCollection`); a config's TransformerEngine sections make them too "
          "([config.md](config.md)).",
          collection_fields());
  return out;
}

}  // namespace sentinel::options
