#pragma once
// Where the tests find the checkout's files and the build's programs. The paths are compiled into
// one small object (test_paths.cpp) rather than into every test file as macros: a test file's object
// then does not depend on where the checkout lies, and the compiler cache serves it to any clone.
#include <string>

namespace sentinel_test {

const std::string& source_dir();
const std::string& test_data_dir();  // tests/data
const std::string& golden_dir();     // tests/golden
const std::string& report_schema();  // reports/report.schema.json
const std::string& cli_program();    // the build's `sentinel`
const std::string& torch_python();   // the Python whose torch wrote the fixtures
const std::string& tensorboard_reader();
const std::string& tensorboard_proto();
const std::string& protoc_program();
const std::string& zoo_dir();  // the torchvision zoo written by tests/zoo/make_zoo.py

}  // namespace sentinel_test
