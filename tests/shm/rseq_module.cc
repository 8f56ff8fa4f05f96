// A small shared object that runs the restartable sequences of shm/stripes.h, as any library
// compiled with them does (libretryd, a binding's extension). rseq_unload_test loads it with
// dlopen, runs its sequences and unloads it: nothing in the thread may still point into it.
#include <cstdint>

#include "shm/stripes.h"

// RetrydRseqModuleRun runs `rounds` rounds of every sequence and every way out of one (commit,
// a compared word that differs, an abort for the wrong CPU) on `words` (three words), and
// returns the number of commits, or -1 when the thread has no rseq registered.
extern "C" __attribute__((visibility("default"))) int RetrydRseqModuleRun(uint64_t* words, int rounds) {
#ifdef RETRYD_HAVE_RSEQ
  using retryd::shm::stripes_internal::RseqAdd;
  using retryd::shm::stripes_internal::RseqCompareStore;
  using retryd::shm::stripes_internal::RseqCompareStore2;
  auto* w = reinterpret_cast<std::atomic<uint64_t>*>(words);
  int commits = 0;
  for (int r = 0; r < rounds; ++r) {
    const uint16_t cpu = retryd::shm::CurrentCpu();
    if (cpu == retryd::shm::kNoStripe) return -1;
    commits += RseqAdd(w[0], 1, cpu);
    const uint64_t v = w[1].load(std::memory_order_relaxed);
    commits += RseqCompareStore(w[1], v, v + 1, cpu) == 0;
    commits += RseqCompareStore(w[1], v + 7, v, cpu) == 0;  // differs
    const uint64_t x = w[2].load(std::memory_order_relaxed);
    commits += RseqCompareStore2(w[2], x, x + 1, w[0], 5, cpu) == 0;
    commits += RseqAdd(w[0], 1, cpu + 1u);  // not on that CPU: the abort path
  }
  return commits;
#else
  (void)words, (void)rounds;
  return -1;
#endif
}
