// TensorBoardWriter, checked through an independent reader (read_tensorboard_events.py: Python's
// protobuf and crc32c modules) rather than through the writer's own code.
#include "loggers/tensorboard/tensorboard_writer.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace fs = std::filesystem;
using sentinel::loggers::masked_crc32c;
using sentinel::loggers::TensorBoardWriter;

namespace {

struct ReaderRun {
  int exit_code = -1;
  std::vector<nlohmann::json> lines;
  std::string err;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void spit(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

bool python_ready() {
  static const bool ready =
      std::system(fmt::format("'{}' -c 'import google.protobuf, crc32c' >/dev/null 2>&1", SENTINEL_TB_PYTHON)
                      .c_str()) == 0;
  return ready;
}

#define REQUIRE_PYTHON()                                                                         \
  do {                                                                                           \
    if (!python_ready())                                                                         \
      GTEST_SKIP() << SENTINEL_TB_PYTHON << " cannot import google.protobuf and crc32c "         \
                   << "(Debian: python3-protobuf python3-crc32c)";                               \
  } while (0)

class TensorBoardWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "sentinel_tb_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr) << std::strerror(errno);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(dir_, ec);
  }

  // Runs the reader on an event file or a directory of them.
  ReaderRun read_events(const std::string& path) const {
    const fs::path err_file = dir_ / "reader.stderr";
    const std::string cmd = fmt::format("'{}' '{}' --protoc '{}' '{}' '{}' 2>'{}'", SENTINEL_TB_PYTHON,
                                        SENTINEL_TB_READER, SENTINEL_TB_PROTOC, SENTINEL_TB_PROTO, path,
                                        err_file.string());
    ReaderRun run;
    FILE* pipe = ::popen(cmd.c_str(), "r");
    if (pipe == nullptr) {
      run.err = fmt::format("popen failed: {}", std::strerror(errno));
      return run;
    }
    std::string out;
    char buf[4096];
    size_t n = 0;
    while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
    const int status = ::pclose(pipe);
    run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    run.err = slurp(err_file);
    size_t start = 0;
    while (start < out.size()) {
      size_t end = out.find('\n', start);
      if (end == std::string::npos) end = out.size();
      if (end > start) run.lines.push_back(nlohmann::json::parse(out.substr(start, end - start)));
      start = end + 1;
    }
    return run;
  }

  fs::path dir_;
};

struct Scalar {
  std::string tag;
  float value;
  int64_t step;
  double wall_time;
  bool same_record_as_previous;  // written by one add_scalars call with the one before
};

// The reader's value: a number (the float32 widened exactly) or "inf", "-inf", "nan".
void expect_value(const nlohmann::json& got, float want, const std::string& tag) {
  if (std::isnan(want)) {
    EXPECT_EQ(got, "nan") << tag;
  } else if (std::isinf(want)) {
    EXPECT_EQ(got, want > 0 ? "inf" : "-inf") << tag;
  } else {
    ASSERT_TRUE(got.is_number()) << tag << ": " << got.dump();
    const double d = got.get<double>();
    // Exactly the float32 written, not merely close: the double is the float widened.
    EXPECT_EQ(d, static_cast<double>(want)) << tag;
    EXPECT_EQ(static_cast<float>(d), want) << tag;
    EXPECT_EQ(std::signbit(d), std::signbit(want)) << tag << " (sign of zero)";
  }
}

// The records of a file: (offset, length) each, from the framing alone.
std::vector<std::pair<size_t, size_t>> record_spans(const std::string& bytes) {
  std::vector<std::pair<size_t, size_t>> spans;
  size_t off = 0;
  while (off + 12 <= bytes.size()) {
    uint64_t len = 0;
    for (int i = 7; i >= 0; --i) len = (len << 8) | static_cast<unsigned char>(bytes[off + i]);
    spans.emplace_back(off, static_cast<size_t>(len));
    off += 12 + len + 4;
  }
  return spans;
}

// Lowers the file-size limit of this process so that write(2) fails with EFBIG: a full disk as
// the kernel reports it, reached through the public API. Restored when the guard goes.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    ok_ = ::getrlimit(RLIMIT_FSIZE, &saved_) == 0;
    old_handler_ = ::signal(SIGXFSZ, SIG_IGN);  // EFBIG instead of the signal's default: exit
    rlimit lowered = saved_;
    lowered.rlim_cur = bytes;
    ok_ = ok_ && ::setrlimit(RLIMIT_FSIZE, &lowered) == 0;
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &saved_);
    ::signal(SIGXFSZ, old_handler_);
  }
  bool ok() const { return ok_; }

 private:
  rlimit saved_{};
  void (*old_handler_)(int) = nullptr;
  bool ok_ = false;
};

}  // namespace

TEST(MaskedCrc32c, KnownVectors) {
  // CRC-32C check value of "123456789" (RFC 3720 / the Castagnoli parameters) is 0xE3069283.
  const uint32_t crc = 0xE3069283u;
  const uint32_t masked = ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
  EXPECT_EQ(masked, 0xC78AB0E5u);
  EXPECT_EQ(masked_crc32c("123456789", 9), masked);
  // The CRC of nothing is 0, so its masked CRC is the offset alone.
  EXPECT_EQ(masked_crc32c("", 0), 0xa282ead8u);
  // RFC 3720 B.4: 32 zero bytes give 0x8A9136AA, 32 0xFF bytes 0x62A8AB43.
  const std::string zeros(32, '\0'), ones(32, '\xff');
  EXPECT_EQ(masked_crc32c(zeros.data(), zeros.size()), ((0x8A9136AAu >> 15) | (0x8A9136AAu << 17)) + 0xa282ead8u);
  EXPECT_EQ(masked_crc32c(ones.data(), ones.size()), ((0x62A8AB43u >> 15) | (0x62A8AB43u << 17)) + 0xa282ead8u);
}

TEST_F(TensorBoardWriterTest, ScalarsRoundTripThroughAnIndependentReader) {
  REQUIRE_PYTHON();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<Scalar> scalars = {
      {"loss", 0.1f, 0, 1700000000.125, false},  // 0.1 has no exact float
      {"loss", -2.5f, 1, 1700000001.5, false},
      {"layer.0.weight/l2_norm", 1.0f / 3.0f, 2, 1700000002.0, false},
      {"under_score/min", std::numeric_limits<float>::denorm_min(), 2, 1700000002.0, true},
      {"under_score/max", std::numeric_limits<float>::max(), 2, 1700000002.0, true},
      {"lowest", std::numeric_limits<float>::lowest(), 3, 1700000003.25, false},
      {"smallest_normal", std::numeric_limits<float>::min(), 4, 1700000004.0, false},
      {"zero", 0.0f, 5, 1700000005.0, false},  // must be written even though it is the default
      {"negative_zero", -0.0f, 5, 1700000005.0, true},
      {"overflow/+inf", inf, 6, 1700000006.0, false},
      {"overflow/-inf", -inf, 6, 1700000006.0, true},
      {"overflow/nan", std::numeric_limits<float>::quiet_NaN(), 6, 1700000006.0, true},
      {"huge", 3.0e38f, 7, 1700000007.0, false},
      {"tiny", -1.0e-30f, 8, 1700000008.0, false},
      {"ünïcödé/損失 🙂", 42.75f, 9, 1700000009.0, false},
      {"big.step", 7.0f, (int64_t{1} << 53) + 1, 1700000010.0, false},
      {"negative.step", 8.0f, -5, 0.0, false},
  };
  std::string path;
  {
    TensorBoardWriter writer((dir_ / "run").string(), ".roundtrip");
    path = writer.path();
    for (size_t i = 0; i < scalars.size();) {
      size_t j = i + 1;
      while (j < scalars.size() && scalars[j].same_record_as_previous) ++j;
      if (j == i + 1) {
        writer.add_scalar(scalars[i].tag, scalars[i].value, scalars[i].step, scalars[i].wall_time);
      } else {
        std::vector<std::pair<std::string, float>> group;
        for (size_t k = i; k < j; ++k) group.emplace_back(scalars[k].tag, scalars[k].value);
        writer.add_scalars(group, scalars[i].step, scalars[i].wall_time);
      }
      i = j;
    }
  }  // no flush(): the destructor writes the rest

  const ReaderRun run = read_events(path);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  ASSERT_EQ(run.lines.size(), scalars.size() + 1) << run.err;
  EXPECT_EQ(run.lines[0].value("file_version", ""), "brain.Event:2");
  EXPECT_EQ(run.lines[0]["record"], 0);
  int64_t previous_record = 0;
  for (size_t i = 0; i < scalars.size(); ++i) {
    const auto& got = run.lines[i + 1];
    const Scalar& want = scalars[i];
    ASSERT_TRUE(got.contains("tag")) << got.dump();
    EXPECT_EQ(got["tag"].get<std::string>(), want.tag);
    EXPECT_EQ(got["step"].get<int64_t>(), want.step) << want.tag;
    EXPECT_EQ(got["wall_time"].get<double>(), want.wall_time) << want.tag;
    expect_value(got["value"], want.value, want.tag);
    const int64_t record = got["record"].get<int64_t>();
    EXPECT_EQ(record, want.same_record_as_previous ? previous_record : previous_record + 1) << want.tag;
    previous_record = record;
  }
}

TEST_F(TensorBoardWriterTest, FileNameAndParentDirectories) {
  const auto before = static_cast<long long>(std::time(nullptr));
  TensorBoardWriter writer((dir_ / "a" / "b" / "c").string(), ".suffix");
  const auto after = static_cast<long long>(std::time(nullptr));
  const fs::path p(writer.path());
  EXPECT_EQ(p.parent_path(), dir_ / "a" / "b" / "c");
  EXPECT_TRUE(fs::is_regular_file(p));
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof host - 1), 0);
  const std::string name = p.filename().string();
  bool matched = false;
  for (long long s = before; s <= after; ++s)
    matched = matched || name == fmt::format("events.out.tfevents.{}.{}.{}.suffix", s, host, ::getpid());
  EXPECT_TRUE(matched) << name;
}

TEST_F(TensorBoardWriterTest, FlushMakesRecordsReadableWhileOpen) {
  REQUIRE_PYTHON();
  TensorBoardWriter writer(dir_.string());
  writer.add_scalar("a", 1.5f, 10, 100.0);
  writer.flush();
  ReaderRun run = read_events(writer.path());
  ASSERT_EQ(run.exit_code, 0) << run.err;
  ASSERT_EQ(run.lines.size(), 2u);
  EXPECT_EQ(run.lines[1]["tag"], "a");
  EXPECT_EQ(run.lines[1]["step"], 10);
  writer.add_scalar("b", 2.5f, 11, 101.0);
  writer.flush();
  run = read_events(writer.path());
  ASSERT_EQ(run.exit_code, 0) << run.err;
  ASSERT_EQ(run.lines.size(), 3u);
  EXPECT_EQ(run.lines[2]["tag"], "b");
}

TEST_F(TensorBoardWriterTest, WritersOfOneSecondKeepTheirOwnFiles) {
  REQUIRE_PYTHON();
  TensorBoardWriter first(dir_.string(), ".same");
  TensorBoardWriter second(dir_.string(), ".same");
  ASSERT_NE(first.path(), second.path());
  first.add_scalar("first", 1.0f, 1, 1.0);
  second.add_scalar("second", 2.0f, 1, 1.0);
  first.flush();
  second.flush();
  for (const auto* w : {&first, &second}) {
    const ReaderRun run = read_events(w->path());
    ASSERT_EQ(run.exit_code, 0) << run.err;
    ASSERT_EQ(run.lines.size(), 2u) << w->path();
    EXPECT_EQ(run.lines[1]["tag"], w == &first ? "first" : "second");
  }
  // The directory form reads both files.
  const ReaderRun all = read_events(dir_.string());
  ASSERT_EQ(all.exit_code, 0) << all.err;
  EXPECT_EQ(all.lines.size(), 4u);
}

TEST_F(TensorBoardWriterTest, ReaderRejectsCorruptedAndTruncatedFiles) {
  REQUIRE_PYTHON();
  std::string path;
  {
    TensorBoardWriter writer(dir_.string());
    path = writer.path();
    writer.add_scalar("x", 1.0f, 1, 1.0);
    writer.add_scalars({{"y", 2.0f}, {"z", 3.0f}}, 2, 2.0);
  }
  const std::string good = slurp(path);
  const ReaderRun ok = read_events(path);
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  ASSERT_EQ(ok.lines.size(), 4u);

  const auto spans = record_spans(good);
  ASSERT_EQ(spans.size(), 3u);
  ASSERT_EQ(spans.back().first + 12 + spans.back().second + 4, good.size());

  // One byte of the last record's data.
  std::string bad = good;
  bad[spans.back().first + 12 + spans.back().second / 2] ^= 0x01;
  spit(path, bad);
  ReaderRun run = read_events(path);
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.err.find("data CRC mismatch"), std::string::npos) << run.err;

  // One byte of the second record's length.
  bad = good;
  bad[spans[1].first] ^= 0x01;
  spit(path, bad);
  run = read_events(path);
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.err.find("length CRC mismatch"), std::string::npos) << run.err;

  // The last record cut short.
  spit(path, good.substr(0, good.size() - 3));
  run = read_events(path);
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.err.find("truncated"), std::string::npos) << run.err;
}

TEST_F(TensorBoardWriterTest, InvalidUtf8TagThrowsAndWritesNothing) {
  REQUIRE_PYTHON();
  TensorBoardWriter writer(dir_.string());
  EXPECT_THROW(writer.add_scalar("bad\xff", 1.0f, 1, 1.0), std::invalid_argument);
  EXPECT_THROW(writer.add_scalars({{"good", 1.0f}, {"\xc0\xaf", 2.0f}}, 1, 1.0), std::invalid_argument);
  EXPECT_THROW(writer.add_scalar("\xed\xa0\x80", 1.0f, 1, 1.0), std::invalid_argument);  // a surrogate
  writer.add_scalar("after", 4.0f, 2, 2.0);
  writer.flush();
  const ReaderRun run = read_events(writer.path());
  ASSERT_EQ(run.exit_code, 0) << run.err;
  ASSERT_EQ(run.lines.size(), 2u);
  EXPECT_EQ(run.lines[1]["tag"], "after");
}

TEST_F(TensorBoardWriterTest, DirectoryUnderARegularFileThrowsWithThePath) {
  const fs::path file = dir_ / "plain_file";
  spit(file, "x");
  for (const fs::path& target : {file / "sub", file}) {
    try {
      TensorBoardWriter writer(target.string());
      ADD_FAILURE() << "no exception for " << target;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(target.string()), std::string::npos) << e.what();
    }
  }
}

TEST_F(TensorBoardWriterTest, ReadOnlyDirectoryThrowsWithThePathAndReason) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes into a read-only directory anyway";
  const fs::path ro = dir_ / "read_only";
  fs::create_directory(ro);
  fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
  try {
    TensorBoardWriter writer(ro.string());
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(ro.string()), std::string::npos) << what;
    EXPECT_NE(what.find(std::strerror(EACCES)), std::string::npos) << what;
  }
}

// The writer creates its file exclusively, so it cannot be pointed at /dev/full; the kernel's
// file-size limit gives the same kind of failure (write(2) refuses, part of a record may be in).
TEST_F(TensorBoardWriterTest, FailedWriteThrowsNamingTheFileAndStaysFailed) {
  // 100 records stay in the buffer until flush(); 10000 overflow it inside add_scalar.
  for (const int records : {100, 10000}) {
    SCOPED_TRACE(records);
    TensorBoardWriter writer(dir_.string(), fmt::format(".{}", records));
    const std::string path = writer.path();
    const auto size = static_cast<rlim_t>(fs::file_size(path));
    std::string message;
    int added = 0;
    {
      FileSizeLimit limit(size + 100);
      ASSERT_TRUE(limit.ok());
      try {
        for (; added < records; ++added) writer.add_scalar("loss", 1.0f, added, 1.0);
        writer.flush();
        ADD_FAILURE() << "no exception although the file may not grow";
      } catch (const std::runtime_error& e) {
        message = e.what();
      }
    }
    EXPECT_EQ(added == records, records == 100) << "thrown after " << added << " records";
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_NE(message.find(std::strerror(EFBIG)), std::string::npos) << message;
    EXPECT_EQ(fs::file_size(path), size + 100);
    // The file now ends mid-record: later writes would be unreadable, so they are refused.
    EXPECT_THROW(writer.add_scalar("loss", 1.0f, 0, 1.0), std::runtime_error);
    EXPECT_THROW(writer.flush(), std::runtime_error);
    if (python_ready()) {
      const ReaderRun run = read_events(path);
      EXPECT_NE(run.exit_code, 0);
      EXPECT_NE(run.err.find("truncated"), std::string::npos) << run.err;
    }
  }
}

TEST_F(TensorBoardWriterTest, FailureFoundByTheDestructorIsPrinted) {
  std::optional<TensorBoardWriter> writer(std::in_place, dir_.string());
  const std::string path = writer->path();
  // The limit binds every file of the process, the one capturing stderr too: the event file is
  // made larger than the message first.
  for (int i = 0; i < 200; ++i) writer->add_scalar("loss", 1.0f, i, 1.0);
  writer->flush();
  const auto size = static_cast<rlim_t>(fs::file_size(path));
  ASSERT_GT(size, 4000u);
  for (int i = 0; i < 100; ++i) writer->add_scalar("loss", 1.0f, i, 1.0);  // buffered, not written
  testing::internal::CaptureStderr();
  {
    FileSizeLimit limit(size + 10);
    writer.reset();  // must not throw
    if (!limit.ok()) ADD_FAILURE() << "setrlimit failed";
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find(path), std::string::npos) << err;
  EXPECT_NE(err.find(std::strerror(EFBIG)), std::string::npos) << err;
  EXPECT_EQ(fs::file_size(path), size + 10);
}
