// fuzz/fuzz_util.h: a tiny reader over the fuzzer's input, shared by the targets.
//
// Every target takes its structured values (words to scribble, times, lengths) from the front
// of the input with `FuzzInput`; a read past the end yields zeros, so every input is usable.
// Thread safety: a value type for one fuzz iteration; not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <string_view>

namespace retryd::fuzz {

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  // Take returns the next `T` from the input (zero-filled past the end).
  template <typename T>
  T Take() {
    T v{};
    const size_t n = std::min(sizeof(T), size_ - pos_);
    if (n > 0) std::memcpy(&v, data_ + pos_, n);
    pos_ += n;
    return v;
  }
  // Rest returns the bytes not taken yet.
  std::string_view Rest() const {
    return {reinterpret_cast<const char*>(data_ + pos_), size_ - pos_};
  }
  size_t remaining() const { return size_ - pos_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace retryd::fuzz
