// The JSON report: valid against reports/report.schema.json, every count present, golden.
#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <sentinel/sentinel.h>

#include <fstream>
#include <sstream>

#include "cli/demo_model.h"
#include "support/golden.h"
#include "support/test_paths.h"

namespace {

using nlohmann::json;

// A validator for the JSON Schema keywords the report schema uses: type, properties, required,
// additionalProperties (false), items, enum, const, minimum, oneOf/anyOf.
void validate(const json& value, const json& schema, const std::string& where, std::vector<std::string>& errors) {
  auto type_ok = [&](const std::string& t) {
    if (t == "object") return value.is_object();
    if (t == "array") return value.is_array();
    if (t == "string") return value.is_string();
    if (t == "integer") return value.is_number_integer();
    if (t == "number") return value.is_number();
    if (t == "boolean") return value.is_boolean();
    if (t == "null") return value.is_null();
    return false;
  };
  if (schema.contains("type")) {
    bool ok = false;
    if (schema["type"].is_array()) for (const auto& t : schema["type"]) ok = ok || type_ok(t.get<std::string>());
    else ok = type_ok(schema["type"].get<std::string>());
    if (!ok) errors.push_back(where + ": expected type " + schema["type"].dump() + ", got " + value.dump());
  }
  for (const char* key : {"oneOf", "anyOf"}) {
    if (!schema.contains(key)) continue;
    int matches = 0;
    for (const auto& option : schema[key]) {
      std::vector<std::string> sub;
      validate(value, option, where, sub);
      matches += sub.empty();
    }
    if (matches == 0 || (std::string(key) == "oneOf" && matches != 1))
      errors.push_back(where + ": " + key + " matched " + std::to_string(matches) + " options: " + value.dump());
  }
  if (schema.contains("enum")) {
    bool found = false;
    for (const auto& e : schema["enum"]) found = found || e == value;
    if (!found) errors.push_back(where + ": not in enum: " + value.dump());
  }
  if (schema.contains("const") && schema["const"] != value) errors.push_back(where + ": not the const");
  if (schema.contains("minimum") && value.is_number() && value.get<double>() < schema["minimum"].get<double>())
    errors.push_back(where + ": below minimum");
  if (value.is_object()) {
    for (const auto& r : schema.value("required", json::array()))
      if (!value.contains(r.get<std::string>())) errors.push_back(where + ": missing required " + r.dump());
    const auto props = schema.value("properties", json::object());
    for (auto it = value.begin(); it != value.end(); ++it) {
      if (props.contains(it.key())) validate(it.value(), props[it.key()], where + "." + it.key(), errors);
      else if (schema.value("additionalProperties", true) == false)
        errors.push_back(where + ": unexpected property " + it.key());
    }
  }
  if (value.is_array() && schema.contains("items")) {
    for (size_t i = 0; i < value.size(); ++i) validate(value[i], schema["items"], where + "[" + std::to_string(i) + "]", errors);
  }
}

// Resolves local "$ref": "#/$defs/x" references so the validator sees plain schemas.
json resolve(const json& node, const json& root) {
  if (node.is_object()) {
    if (node.contains("$ref")) {
      std::string ref = node["$ref"].get<std::string>();
      return resolve(root.at(json::json_pointer(ref.substr(1))), root);
    }
    json out = json::object();
    for (auto it = node.begin(); it != node.end(); ++it) out[it.key()] = resolve(it.value(), root);
    return out;
  }
  if (node.is_array()) {
    json out = json::array();
    for (const auto& v : node) out.push_back(resolve(v, root));
    return out;
  }
  return node;
}

json load_schema() {
  std::ifstream in(sentinel_test::report_schema());
  json raw = json::parse(in);
  return resolve(raw, raw);
}

sentinel::Report demo_report() {
  auto model = sentinel::demo::make_t5_encoder();
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out));
  torch::NoGradGuard no_grad;
  for (auto& b : sentinel::demo::make_batches()) {
    try {
      debug.forward(b);
    } catch (const sentinel::NonFiniteError& e) {
      return e.report();
    }
  }
  ADD_FAILURE() << "the demo did not overflow";
  return {};
}

TEST(JsonReport, DemoReportIsValidAgainstTheSchemaAndCarriesEveryCount) {
  const auto report = demo_report();
  const json j = json::parse(sentinel::render_json(report));
  std::vector<std::string> errors;
  validate(j, load_schema(), "$", errors);
  for (const auto& e : errors) ADD_FAILURE() << e;
  EXPECT_EQ(j["batch_number"], 3);
  // The place rule: the report stops at the residual add that reads the feed-forward's inf; the
  // op that made it, the gated mul, is the origin frame.
  EXPECT_EQ(j["produced_here"], false);
  EXPECT_EQ(j["escape"], "read");
  const auto& trigger = j["frames"][j["trigger_frame"].get<size_t>()];
  EXPECT_EQ(trigger["op"], "aten::add");
  const auto& made = j["origin_frame"];
  EXPECT_EQ(made["op"], "aten::mul");
  const auto& out = made["entries"].back();
  EXPECT_EQ(out["label"], "output");
  ASSERT_TRUE(report.origin_frame);
  const auto& made_frame = *report.origin_frame;
  EXPECT_EQ(out["stats"]["pos_inf"].get<int64_t>() + out["stats"]["neg_inf"].get<int64_t>(),
            made_frame.entries.back().stats.pos_inf + made_frame.entries.back().stats.neg_inf);
  EXPECT_GT(out["stats"]["pos_inf"].get<int64_t>() + out["stats"]["neg_inf"].get<int64_t>(), 0);
  EXPECT_EQ(out["stats"]["count"], 2 * 4 * 32);
  // The tolerated values, counted: the mul's, as the origin frame holds them.
  ASSERT_FALSE(j["tolerated"].empty());
  EXPECT_EQ(j["tolerated"][0]["op"], "aten::mul");
  EXPECT_EQ(j["tolerated"][0]["pos_inf"].get<int64_t>() + j["tolerated"][0]["neg_inf"].get<int64_t>(),
            made_frame.entries.back().stats.pos_inf + made_frame.entries.back().stats.neg_inf);
}

TEST(JsonReport, SchemaRejectsWhatIsWrong) {
  // The validator and schema must be able to fail: break a report and expect errors.
  json j = json::parse(sentinel::render_json(demo_report()));
  j["frames"][0]["direction"] = "sideways";
  j.erase("batch_number");
  std::vector<std::string> errors;
  validate(j, load_schema(), "$", errors);
  EXPECT_GE(errors.size(), 2u);
}

TEST(JsonReport, RanksReportsAreValidAndCarryTheAgreement) {
  sentinel::Report r = demo_report();
  r.kind = "peer_nonfinite";
  r.rank = 2;
  r.world_size = 4;
  r.ranks.exchanged = true;
  r.ranks.role = sentinel::RankRole::Stopped;
  sentinel::RankEvent first;
  first.rank = 1;
  first.batch_number = 3;
  first.direction = sentinel::Direction::Backward;
  first.op_index = 17;
  first.frame = "fc1 (Linear) grad AddmmBackward0";
  first.origin = "origin: ...";
  r.ranks.first = first;
  r.ranks.tripped = {1};
  r.ranks.missing = {3};
  const json j = json::parse(sentinel::render_json(r));
  std::vector<std::string> errors;
  validate(j, load_schema(), "$", errors);
  for (const auto& e : errors) ADD_FAILURE() << e;
  EXPECT_EQ(j["ranks"]["role"], "stopped");
  EXPECT_EQ(j["ranks"]["first"]["rank"], 1);
  EXPECT_EQ(j["ranks"]["first"]["direction"], "backward");
  EXPECT_EQ(j["ranks"]["first"]["op_index"], 17);
  EXPECT_EQ(j["ranks"]["missing"], json::array({3}));
  // The schema must be able to fail on the new part too.
  json broken = j;
  broken["ranks"]["role"] = "bystander";
  broken["ranks"]["first"].erase("op_index");
  errors.clear();
  validate(broken, load_schema(), "$", errors);
  EXPECT_GE(errors.size(), 2u);
  // The text says the same.
  const std::string text = sentinel::render_text(r);
  EXPECT_NE(text.find("Another rank detected inf/nan; none during batch_number=3 on rank 2"), std::string::npos);
  EXPECT_NE(text.find("First to see inf/nan: rank 1, batch 3, backward op 17"), std::string::npos) << text;
  EXPECT_NE(text.find("Ranks that did not answer: 3"), std::string::npos);
}

// Floating-point values depend on the BLAS build's last bits; names, counts and layout do not.
void mask_floats(json& j) {
  if (j.is_number_float()) j = "<float>";
  else if (j.is_structured()) for (auto& v : j) mask_floats(v);
}

TEST(JsonReport, GoldenWithVolatileFieldsMasked) {
  json j = json::parse(sentinel::render_json(demo_report()));
  j["sentinel_version"] = "<masked>";
  j["stack"] = "<masked>";  // this machine's build paths and inlining
  mask_floats(j);
  sentinel_test::expect_matches_golden(j.dump(2) + "\n", "demo_report.json");
}

}  // namespace
