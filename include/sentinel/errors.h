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

// inf/nan detected; what() is the full text report.
class NonFiniteError : public Error {
 public:
  NonFiniteError(Report report, const std::string& text) : Error(text), report_(std::move(report)) {}
  const Report& report() const noexcept { return report_; }

 private:
  Report report_;
};

// An FP8 alarm (overflow fraction or scale drift over its threshold) with Action::Throw.
class Fp8AlarmError : public Error {
 public:
  Fp8AlarmError(Report report, const std::string& text) : Error(text), report_(std::move(report)) {}
  const Report& report() const noexcept { return report_; }

 private:
  Report report_;
};

// Ranks did not answer the exchange (died, left, or did not reach it within
// RankOptions::max_wait_seconds) and no rank that answered saw inf/nan; what() is this rank's report.
class RanksMissingError : public Error {
 public:
  RanksMissingError(Report report, const std::string& text) : Error(text), report_(std::move(report)) {}
  const Report& report() const noexcept { return report_; }

 private:
  Report report_;
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
