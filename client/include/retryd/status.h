// retryd/status.h: the result of a cold-path operation (attach, resolve, config, CLI).
//
// A `Status` is OK or carries a code and a message that names the problem ("segment 'retryd':
// layout version 3 is newer than this library's 2"). The hot path never returns one.
// The class is `[[nodiscard]]`: a dropped Status is an error nobody sees, so every function
// returning one is checked. Drop one only with `(void)` and a comment that says why.
// Thread safety: a value type; const methods are safe to call concurrently.
#pragma once

#include <string>
#include <utility>

namespace retryd {

class [[nodiscard]] Status {
 public:
  // The codes match the C ABI's RETRYD_E* values (retryd.h).
  enum class Code : int {
    kOk = 0,
    kInvalidArgument = -1,   // a bad name, option or config value
    kNotFound = -2,          // no such segment or dependency
    kPermissionDenied = -3,  // the segment exists but this process may not map it
    kIncompatible = -4,      // foreign, truncated, corrupt, retired or newer-layout segment
    kFull = -5,              // no free dependency or process slot
    kIoError = -6,           // any other system error
  };

  Status() = default;
  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) { return Status(Code::kInvalidArgument, std::move(m)); }
  static Status NotFound(std::string m) { return Status(Code::kNotFound, std::move(m)); }
  static Status PermissionDenied(std::string m) { return Status(Code::kPermissionDenied, std::move(m)); }
  static Status Incompatible(std::string m) { return Status(Code::kIncompatible, std::move(m)); }
  static Status Full(std::string m) { return Status(Code::kFull, std::move(m)); }
  static Status IoError(std::string m) { return Status(Code::kIoError, std::move(m)); }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // ToString returns "OK" or "<code name>: <message>".
  std::string ToString() const {
    if (ok()) return "OK";
    return std::string(CodeName(code_)) + ": " + message_;
  }
  static const char* CodeName(Code c) {
    switch (c) {
      case Code::kOk: return "OK";
      case Code::kInvalidArgument: return "invalid argument";
      case Code::kNotFound: return "not found";
      case Code::kPermissionDenied: return "permission denied";
      case Code::kIncompatible: return "incompatible segment";
      case Code::kFull: return "full";
      case Code::kIoError: return "I/O error";
    }
    return "unknown";
  }

 private:
  Status(Code c, std::string m) : code_(c), message_(std::move(m)) {}
  Code code_ = Code::kOk;
  std::string message_;
};

}  // namespace retryd
