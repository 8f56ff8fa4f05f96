// The thread's rseq area after a restartable sequence (shm/stripes.h): its `rseq_cs` is 0
// again, whichever way the sequence ended. A descriptor left there is read by the kernel at the
// thread's next preemption or signal; if the library that holds it was unloaded meanwhile
// (dlclose, an interpreter unloading an extension), that read faults and the kernel kills the
// process with SIGSEGV. rseq_module.cc is a small library with the same sequences.
#include <dlfcn.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <memory>

#include "shm/admission.h"
#include "shm/segment.h"
#include "shm/stripes.h"
#include "tests/sanitized.h"
#include "tests/shm/test_util.h"

namespace retryd::shm {
namespace {

#ifdef RETRYD_HAVE_RSEQ

// The thread's rseq_cs word, or nullptr when the thread has no rseq registered.
volatile uint64_t* RseqCs() {
  if (__rseq_size < 8) return nullptr;
  auto* area = reinterpret_cast<struct rseq*>(static_cast<char*>(__builtin_thread_pointer()) +
                                              __rseq_offset);
  return reinterpret_cast<volatile uint64_t*>(&area->rseq_cs);
}

#define SKIP_WITHOUT_RSEQ()                                                              \
  if (RseqCs() == nullptr || CurrentCpu() == kNoStripe) {                                \
    GTEST_SKIP() << "this thread has no rseq registered (glibc < 2.35 or glibc.pthread.rseq=0)"; \
  }

// Every sequence, and every way out of it, leaves rseq_cs at 0: a commit, a compared word that
// differs, an abort because the thread is not on the stripe's CPU.
TEST(RseqDescriptorTest, EverySequenceLeavesTheThreadsDescriptorCleared) {
  SKIP_WITHOUT_RSEQ();
  using stripes_internal::RseqAdd;
  using stripes_internal::RseqCompareStore;
  using stripes_internal::RseqCompareStore2;
  std::atomic<uint64_t> a{0}, b{0};
  int commits = 0;
  for (int round = 0; round < 1000; ++round) {
    const uint16_t cpu = CurrentCpu();
    commits += RseqAdd(a, 1, cpu);
    ASSERT_EQ(*RseqCs(), 0u) << "after an add";
    const uint64_t v = b.load();
    commits += RseqCompareStore(b, v, v + 1, cpu) == 0;
    ASSERT_EQ(*RseqCs(), 0u) << "after a compare-and-store";
    EXPECT_NE(RseqCompareStore(b, v + 100, 0, cpu), 0);
    ASSERT_EQ(*RseqCs(), 0u) << "after a compare-and-store that found another value";
    const uint64_t w = b.load();
    commits += RseqCompareStore2(b, w, w + 1, a, a.load(), cpu) == 0;
    ASSERT_EQ(*RseqCs(), 0u) << "after a two-word compare-and-store";
    EXPECT_NE(RseqCompareStore2(b, w + 100, 0, a, a.load(), cpu), 0);
    ASSERT_EQ(*RseqCs(), 0u) << "after a two-word compare-and-store that found another value";
    EXPECT_FALSE(RseqAdd(a, 1, cpu + 1u));
    ASSERT_EQ(*RseqCs(), 0u) << "after a sequence aborted on another CPU";
  }
  EXPECT_GT(commits, 0);
}

// The hot path through the stripes: Admit and Complete of a first attempt that succeeds, with
// the caller on its CPU's stripe, leave rseq_cs at 0.
TEST(RseqDescriptorTest, AdmitAndCompleteOnTheStripesLeaveTheDescriptorCleared) {
  SKIP_WITHOUT_RSEQ();
  std::unique_ptr<Segment> seg = Segment::CreatePrivate(4, 4, Policy{});
  uint32_t index = 0;
  ASSERT_TRUE(seg->PutDependency("orders", Policy{}, &index).ok());
  DependencySlot& slot = *seg->dependency(index);
  Caller caller{1, 0, 12345};
  for (int i = 0; i < 1000; ++i) {
    caller.OnCpu(CurrentCpu());
    Permit p;
    ASSERT_TRUE(IsAdmitted(Admit(slot, index, 0, uint64_t(i + 1) * 1'000'000, caller, &p)));
    ASSERT_EQ(*RseqCs(), 0u) << "after an admit";
    Complete(slot, &p, Outcome::kSuccess, 1'000, uint64_t(i + 1) * 1'000'000, caller);
    ASSERT_EQ(*RseqCs(), 0u) << "after a complete";
  }
  EXPECT_GT(ReadCounter(slot, kSuccesses), 0u);
}

// A real process loads a library with the sequences, runs them, unloads it, and is then
// signalled and preempted on the same thread many times: it must live. With rseq_cs left
// pointing into the unmapped library the kernel could not read the descriptor and killed the
// process with SIGSEGV at the first signal.
TEST(RseqDescriptorTest, AProcessOutlivesTheUnloadOfALibraryThatRanSequences) {
  SKIP_WITHOUT_RSEQ();
  int status = 0;
  const pid_t pid = fork();
  if (pid == 0) {
    void* lib = dlopen(RETRYD_RSEQ_MODULE, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) _exit(10);
    using RunFn = int (*)(uint64_t*, int);
    auto run = reinterpret_cast<RunFn>(dlsym(lib, "RetrydRseqModuleRun"));
    if (run == nullptr) _exit(11);
    uint64_t words[3] = {};
    if (run(words, 1000) <= 0) _exit(12);
    const uint64_t left = *RseqCs();
    if (dlclose(lib) != 0) _exit(13);
    // The library must really be gone, or this proves nothing.
    if (dlopen(RETRYD_RSEQ_MODULE, RTLD_NOW | RTLD_NOLOAD) != nullptr) _exit(14);
    struct sigaction sa = {};
    sa.sa_handler = [](int) {};
    sigaction(SIGUSR1, &sa, nullptr);
    for (int i = 0; i < 1000; ++i) {
      raise(SIGUSR1);
      sched_yield();
    }
    _exit(left == 0 ? 0 : 15);
  }
  ASSERT_GT(pid, 0);
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_FALSE(WIFSIGNALED(status)) << "the child died of signal " << WTERMSIG(status);
  ASSERT_TRUE(WIFEXITED(status));
#if defined(RETRYD_ADDRESS_SANITIZER) || defined(RETRYD_THREAD_SANITIZER)
  // A sanitizer's runtime may keep an unloaded library mapped.
  if (WEXITSTATUS(status) == 14) GTEST_SKIP() << "the library stayed loaded under the sanitizer";
#endif
  EXPECT_NE(WEXITSTATUS(status), 14) << "the library was not unloaded: the test proves nothing";
  EXPECT_NE(WEXITSTATUS(status), 15) << "rseq_cs still pointed into the library before dlclose";
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

#else
TEST(RseqDescriptorTest, NoSequencesOnThisPlatform) { GTEST_SKIP() << "no rseq sequences here"; }
#endif

}  // namespace
}  // namespace retryd::shm
