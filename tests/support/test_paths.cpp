#include "support/test_paths.h"

namespace sentinel_test {

const std::string& source_dir() {
  static const std::string path = SENTINEL_SOURCE_DIR;
  return path;
}
const std::string& test_data_dir() {
  static const std::string path = source_dir() + "/tests/data";
  return path;
}
const std::string& golden_dir() {
  static const std::string path = source_dir() + "/tests/golden";
  return path;
}
const std::string& report_schema() {
  static const std::string path = source_dir() + "/reports/report.schema.json";
  return path;
}
const std::string& cli_program() {
  static const std::string path = SENTINEL_CLI_PATH;
  return path;
}
const std::string& torch_python() {
  static const std::string path = SENTINEL_TORCH_PYTHON;
  return path;
}
const std::string& tensorboard_reader() {
  static const std::string path = source_dir() + "/tests/loggers/read_tensorboard_events.py";
  return path;
}
const std::string& tensorboard_proto() {
  static const std::string path = source_dir() + "/src/loggers/tensorboard/tensorboard_event.proto";
  return path;
}
const std::string& protoc_program() {
  static const std::string path = SENTINEL_TB_PROTOC;
  return path;
}
const std::string& zoo_dir() {
  static const std::string path = SENTINEL_ZOO_DIR;
  return path;
}

}  // namespace sentinel_test
