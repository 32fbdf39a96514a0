#include "loggers/tensorboard/tensorboard_writer.h"

#include <fcntl.h>
#include <limits.h>
#include <unistd.h>

#include <boost/crc.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <iterator>
#include <stdexcept>
#include <system_error>

#include <fmt/format.h>

#include "tensorboard_event.pb.h"

namespace sentinel {
namespace loggers {

namespace {

// Records are gathered and written in one write(2) once this much is pending (or on flush()), so
// a step's scalars cost one system call, not one per record.
constexpr size_t kSpillBytes = 64 * 1024;

// Tried before giving up when the exclusive create keeps finding the name taken.
constexpr int kMaxNameAttempts = 1000;

std::string errno_text(int err) { return std::system_category().message(err); }

std::string host_name() {
  char buf[HOST_NAME_MAX + 1] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// TensorBoard's readers decode tags as strict UTF-8 (the field is a proto3 string): one bad tag
// would make the whole Event unreadable, taking the other scalars of its step with it.
bool valid_utf8(const std::string& s) {
  static const uint32_t kMinForLength[] = {0, 0, 0x80, 0x800, 0x10000};  // rejects overlong forms
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    uint32_t cp = 0;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1Fu;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0Fu;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07u;
    } else {
      return false;
    }
    if (n - i < len) return false;
    for (size_t k = 1; k < len; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3Fu);
    }
    if (cp < kMinForLength[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

std::string escaped(const std::string& s) {
  std::string out;
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7F && c != '\\')
      out += ch;
    else
      fmt::format_to(std::back_inserter(out), "\\x{:02x}", c);
  }
  return out;
}

void put_le(char* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
}

}  // namespace

uint32_t masked_crc32c(const void* data, size_t n) {
  // CRC-32C (Castagnoli), reflected, as TFRecord framing uses it.
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(data, n);
  const uint32_t c = crc.checksum();
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, const std::string& suffix) {
  const std::filesystem::path base(dir.empty() ? "." : dir);
  std::error_code ec;
  std::filesystem::create_directories(base, ec);
  if (ec)
    throw std::runtime_error(
        fmt::format("cannot create the TensorBoard log directory {}: {}", base.string(), ec.message()));

  const auto seconds = static_cast<long long>(std::time(nullptr));
  const std::string host = host_name();
  const auto pid = static_cast<long long>(::getpid());
  for (int attempt = 0;; ++attempt) {
    const std::string name =
        attempt == 0 ? fmt::format("events.out.tfevents.{}.{}.{}{}", seconds, host, pid, suffix)
                     : fmt::format("events.out.tfevents.{}.{}.{}.{}{}", seconds, host, pid, attempt, suffix);
    path_ = (base / name).string();
    // Exclusive, so that two writers of one process started in the same second never truncate
    // each other's file (both would then write into it at their own offsets).
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ >= 0) break;
    const int err = errno;
    if (err == EINTR) {
      --attempt;
      continue;
    }
    if (err != EEXIST || attempt + 1 >= kMaxNameAttempts)
      throw std::runtime_error(
          fmt::format("cannot create the TensorBoard event file {}: {}", path_, errno_text(err)));
  }

  sentinel::tensorboard::Event event;
  event.set_wall_time(unix_now());
  event.set_step(0);
  event.set_file_version("brain.Event:2");
  std::string data;
  event.SerializeToString(&data);
  append_record(data);
  // Written at once: a file that cannot take even its first record is reported here, and the
  // file left behind is readable (TensorBoard skips a run whose file ends mid-record).
  write_out();
  if (!error_.empty()) {
    ::close(fd_);
    ::unlink(path_.c_str());
    throw std::runtime_error(error_);
  }
}

TensorBoardWriter::~TensorBoardWriter() {
  if (fd_ < 0) return;
  if (error_.empty()) write_out();
  // close() is where some file systems (NFS among them) report a failed write-back.
  if (::close(fd_) != 0 && errno != EINTR && error_.empty())
    error_ = fmt::format("cannot write the TensorBoard event file {}: close: {}", path_, errno_text(errno));
  if (!error_.empty() && !error_seen_) {
    try {
      fmt::print(stderr, "sentinel: {}\n", error_);
    } catch (...) {
    }
  }
}

void TensorBoardWriter::add_scalar(const std::string& tag, float value, int64_t step, double wall_time) {
  add_scalars({{tag, value}}, step, wall_time);
}

void TensorBoardWriter::add_scalars(const std::vector<std::pair<std::string, float>>& values, int64_t step,
                                    double wall_time) {
  throw_if_failed();
  if (values.empty()) return;
  for (const auto& tv : values)
    if (!valid_utf8(tv.first))
      throw std::invalid_argument(
          fmt::format("TensorBoard tag \"{}\" is not valid UTF-8 (nothing written to {})", escaped(tv.first), path_));

  sentinel::tensorboard::Event event;
  event.set_wall_time(wall_time);
  event.set_step(step);
  auto* summary = event.mutable_summary();
  summary->mutable_value()->Reserve(static_cast<int>(values.size()));
  for (const auto& tv : values) {
    auto* v = summary->add_value();
    v->set_tag(tv.first);
    v->set_simple_value(tv.second);
  }
  std::string data;
  if (!event.SerializeToString(&data))
    throw std::runtime_error(fmt::format("cannot serialize a TensorBoard event for {}", path_));
  append_record(data);
  if (buffer_.size() >= kSpillBytes) {
    write_out();
    throw_if_failed();
  }
}

void TensorBoardWriter::flush() {
  throw_if_failed();
  write_out();
  throw_if_failed();
}

const std::string& TensorBoardWriter::path() const { return path_; }

void TensorBoardWriter::append_record(const std::string& data) {
  // TFRecord: uint64 length, masked CRC of those 8 bytes, the data, masked CRC of the data; all
  // little-endian whatever the host.
  char header[12];
  put_le(header, data.size(), 8);
  put_le(header + 8, masked_crc32c(header, 8), 4);
  char footer[4];
  put_le(footer, masked_crc32c(data.data(), data.size()), 4);
  buffer_.append(header, sizeof header);
  buffer_ += data;
  buffer_.append(footer, sizeof footer);
}

void TensorBoardWriter::write_out() {
  if (!error_.empty()) return;
  size_t done = 0;
  while (done < buffer_.size()) {
    const ssize_t n = ::write(fd_, buffer_.data() + done, buffer_.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      // A zero-byte write of a non-empty buffer makes no progress: reported rather than retried.
      const int err = n < 0 ? errno : EIO;
      error_ = fmt::format("cannot write the TensorBoard event file {}: {}", path_, errno_text(err));
      buffer_.clear();
      return;
    }
    done += static_cast<size_t>(n);
  }
  buffer_.clear();
}

void TensorBoardWriter::throw_if_failed() {
  if (error_.empty()) return;
  error_seen_ = true;
  throw std::runtime_error(error_);
}

}  // namespace loggers
}  // namespace sentinel
