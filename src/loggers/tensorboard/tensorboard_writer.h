#pragma once
// A writer of TensorBoard event files holding scalar summaries. Each record is one serialized
// Event in TFRecord framing, so `tensorboard --logdir <dir>` plots what is written here.
//
// The protobuf types stay out of this header: its users need neither the generated code nor
// libprotobuf's headers.
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace sentinel {
namespace loggers {

// Masked CRC-32C of TFRecord framing (exposed for tests): the CRC is rotated and offset so that
// a CRC computed over data that itself holds CRCs does not degenerate.
uint32_t masked_crc32c(const void* data, size_t n);

// Not thread-safe: one writer is used by one thread at a time.
class TensorBoardWriter {
 public:
  // Creates `dir` (and parents) and opens events.out.tfevents.<unix seconds>.<hostname>.<pid><suffix>
  // in it, then writes the first record (file_version "brain.Event:2"). The file is created
  // exclusively: when another writer of this process made that name in the same second, ".<n>" is
  // added after the pid instead of overwriting its file. Throws std::runtime_error naming the path
  // and the reason (errno text) when it cannot.
  explicit TensorBoardWriter(const std::string& dir, const std::string& suffix = "");
  ~TensorBoardWriter();  // flushes, never throws (a failure then is printed to stderr)

  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One Event with one scalar summary value. Records are buffered: a write failure is thrown here
  // when the buffer is written out, or by flush().
  void add_scalar(const std::string& tag, float value, int64_t step, double wall_time);
  // Several scalars of one step in one Event (one record). Nothing is written for an empty list.
  // Tags must be valid UTF-8 (TensorBoard cannot parse an Event otherwise): std::invalid_argument,
  // and nothing is written, when one is not.
  void add_scalars(const std::vector<std::pair<std::string, float>>& values, int64_t step, double wall_time);
  // Hands the buffered records to the kernel (no fsync). Throws std::runtime_error naming the file
  // when a write failed (disk full, removed directory...). After a failure the file may end in a
  // partial record, so every later add or flush throws the same error.
  void flush();
  const std::string& path() const;

 private:
  void append_record(const std::string& data);
  void write_out();  // records a failure in error_ instead of throwing (the destructor uses it)
  void throw_if_failed();

  std::string path_;
  int fd_ = -1;
  std::string buffer_;
  std::string error_;        // the first write failure; empty while the file is sound
  bool error_seen_ = false;  // whether error_ reached the caller as an exception
};

}  // namespace loggers
}  // namespace sentinel
