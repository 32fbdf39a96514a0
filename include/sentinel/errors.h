#pragma once
// One exception hierarchy: everything the sentinel throws derives from sentinel::Error.
#include <sentinel/report.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace sentinel {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An option or argument with an invalid value.
class OptionError : public Error {
 public:
  using Error::Error;
};

// A missing, unreadable or malformed model, inputs file or report directory.
class InputError : public Error {
 public:
  using Error::Error;
};

// An error that carries a report; what() is the report's text.
class ReportError : public Error {
 public:
  ReportError(Report report, const std::string& text) : Error(text), report_(std::move(report)) {}
  const Report& report() const noexcept { return report_; }

 private:
  Report report_;
};

// inf/nan detected (on this rank, or on another rank that this one stops with).
class NonFiniteError : public ReportError {
 public:
  using ReportError::ReportError;
};

// An FP8 alarm (overflow fraction or scale drift over its threshold) with Action::Throw.
class Fp8AlarmError : public ReportError {
 public:
  using ReportError::ReportError;
};

// Ranks did not answer the exchange (died, left, or did not reach it within
// RankOptions::max_wait_seconds) and no rank that answered saw inf/nan.
class RanksMissingError : public ReportError {
 public:
  using ReportError::ReportError;
};

// abort_after_batch_num reached.
class AbortAfterBatch : public Error {
 public:
  AbortAfterBatch(int64_t batch, int64_t abort_after_batch_num)
      : Error("sentinel: aborting after batch " + std::to_string(batch) +
              " as requested by abort_after_batch_num=" + std::to_string(abort_after_batch_num)),
        batch_(batch) {}
  int64_t batch() const noexcept { return batch_; }

 private:
  int64_t batch_;
};

}  // namespace sentinel
