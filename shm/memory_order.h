// shm/memory_order.h: the name of the memory order most shared words are read and written with.
//
// Relaxed: the word stands alone (a counter, a stripe's count, a word whose readers order
// themselves by another's acquire). Every other order is spelled out where it is used, with
// the reason beside it.
#pragma once

#include <atomic>

namespace retryd {

inline constexpr auto kRelaxed = std::memory_order_relaxed;

}  // namespace retryd
