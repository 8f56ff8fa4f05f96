// The segment's lifecycle on real POSIX shm objects: create, adopt, retire, and refusals of
// everything a client cannot trust.
#include "shm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <vector>

#include <gtest/gtest.h>

#include "shm/admission.h"
#include "shm/breaker.h"
#include "shm/clock.h"
#include "shm/latency.h"
#include "shm/registry.h"
#include "shm/view.h"
#include "tests/shm/test_util.h"

namespace retryd::shm {
namespace {

// WriteRaw makes /dev/shm/NAME hold exactly `bytes`.
void WriteRaw(const std::string& name, const std::string& bytes) {
  const int fd = shm_open(("/" + name).c_str(), O_CREAT | O_RDWR | O_TRUNC, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, bytes.data(), bytes.size()), ssize_t(bytes.size()));
  close(fd);
}

Status AttachStatus(const std::string& name) {
  std::unique_ptr<Segment> seg;
  return Segment::Attach(name, Access::kReadOnly, &seg);
}

TEST(SegmentTest, MissingSegmentIsNotFound) {
  Status s = AttachStatus(testing::UniqueSegmentName("missing"));
  EXPECT_EQ(s.code(), Status::Code::kNotFound);
  EXPECT_NE(s.message().find("is retryd running?"), std::string::npos) << s.message();
}

TEST(SegmentTest, RefusesForeignTruncatedAndNewer) {
  const std::string name = testing::UniqueSegmentName("bad");
  WriteRaw(name, "hello, not a segment");
  Status s = AttachStatus(name);
  EXPECT_EQ(s.code(), Status::Code::kIncompatible);
  EXPECT_NE(s.message().find("truncated"), std::string::npos) << s.message();

  WriteRaw(name, std::string(4096, 'x'));
  s = AttachStatus(name);
  EXPECT_EQ(s.code(), Status::Code::kIncompatible);
  EXPECT_NE(s.message().find("foreign"), std::string::npos) << s.message();
  Segment::Remove(name);

  testing::NamedSegment good("newer");
  good.seg->header().layout_version.store(kLayoutVersion + 1);
  s = AttachStatus(good.name);
  EXPECT_EQ(s.code(), Status::Code::kIncompatible);
  EXPECT_NE(s.message().find("newer"), std::string::npos) << s.message();
}

TEST(SegmentTest, RefusesCorruptSizesAndRetired) {
  testing::NamedSegment good("corrupt");
  good.seg->header().max_dependencies.store(1'000'000);
  EXPECT_EQ(AttachStatus(good.name).code(), Status::Code::kIncompatible);
  good.seg->header().max_dependencies.store(16);
  good.seg->header().total_size.store(1);
  EXPECT_EQ(AttachStatus(good.name).code(), Status::Code::kIncompatible);
  good.seg->header().total_size.store(SegmentSize(16, 64, good.seg->stripes_per_slot()));
  EXPECT_TRUE(AttachStatus(good.name).ok());
  good.seg->header().retired.store(1);
  Status s = AttachStatus(good.name);
  EXPECT_EQ(s.code(), Status::Code::kIncompatible);
  EXPECT_NE(s.message().find("retired"), std::string::npos);
}

TEST(SegmentTest, TruncatedTablesAreRefused) {
  testing::NamedSegment good("short");
  const int fd = shm_open(("/" + good.name).c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, off_t(sizeof(SegmentHeader) + 100)), 0);
  close(fd);
  Status s = AttachStatus(good.name);
  EXPECT_EQ(s.code(), Status::Code::kIncompatible);
  EXPECT_NE(s.message().find("truncated"), std::string::npos) << s.message();
}

TEST(SegmentTest, AdoptKeepsStateAndIncompatibleIsRetired) {
  testing::NamedSegment first("adopt");
  Policy p;
  const uint32_t i = testing::AddDependency(*first.seg, "orders", p);
  BreakerWord open{BreakerState::kOpen, 2, 0, 7, 123};
  first.seg->dependency(i)->breaker.store(open.Encode());

  CreateOptions opt;
  opt.name = first.name;
  opt.max_dependencies = 16;
  opt.max_processes = 64;
  opt.stripes = first.seg->stripes_per_slot();
  std::unique_ptr<Segment> again;
  bool adopted = false;
  std::string note;
  ASSERT_TRUE(Segment::CreateOrAdopt(opt, &again, &adopted, &note).ok());
  EXPECT_TRUE(adopted);
  ASSERT_EQ(again->Find("orders"), int32_t(i));
  EXPECT_EQ(BreakerWord::Decode(again->dependency(i)->breaker.load()).state, BreakerState::kOpen);

  // Another capacity: the old one is retired in place (clients see it) and replaced.
  opt.max_dependencies = 32;
  std::unique_ptr<Segment> fresh;
  ASSERT_TRUE(Segment::CreateOrAdopt(opt, &fresh, &adopted, &note).ok());
  EXPECT_FALSE(adopted);
  EXPECT_NE(note.find("retired"), std::string::npos) << note;
  EXPECT_EQ(first.seg->header().retired.load(), 1u);
  EXPECT_EQ(fresh->Find("orders"), -1);
  EXPECT_TRUE(AttachStatus(first.name).ok());
}

// A new dependency's breaker is closed at its creation, and that close is the floor of its
// window: the calls stamped in the periods before it are not counted (FloorPeriod). The clients
// stamp their calls with the coarse clock, so the close must never be ahead of a coarse read
// made after it. Stamped with the precise clock, it always was here (a tick's lag), and a
// creation just past a period's start hid the first calls that came right after it from the
// reads of later ones: here, with 50 ms periods, a success at once and three failures once the
// clock has passed the creation (a worker forked meanwhile) read as three calls, under
// min_calls, and the breaker stayed closed.
TEST(SegmentTest, TheCallsRightAfterADependencyIsCreatedAllCount) {
  Policy p;
  p.min_calls = 4;
  p.failure_rate_pct = 50;
  p.window_ms = 500;  // ten periods of 50 ms: many period starts in the second this runs
  p.open_for_ms = 60'000;
  p.open_for_max_ms = 60'000;
  const uint64_t start = CoarseNowNs();
  int rounds = 0, not_tripped = 0, stamped_ahead = 0, outlasted = 0;
  // A second of rounds (20 period starts), and on a loaded machine on until 200 rounds ran.
  while (CoarseNowNs() - start < 1'000'000'000u ||
         (rounds < 200 && CoarseNowNs() - start < 60'000'000'000u)) {
    std::unique_ptr<Segment> seg = Segment::CreatePrivate(2, 2, p);
    uint32_t index = 0;
    ASSERT_TRUE(seg->PutDependency("orders", p, &index).ok());
    DependencySlot& slot = *seg->dependency(index);
    const uint32_t created_ms = BreakerWord::Decode(slot.breaker.load()).time_ms;
    stamped_ahead += !MsReached(NsToMs32(CoarseNowNs()), created_ms);
    Caller caller{RegisterProcess(*seg, getpid()), 0, 1};
    const uint64_t first_ns = CoarseNowNs();
    for (const Outcome o : {Outcome::kSuccess, Outcome::kFailure, Outcome::kFailure,
                            Outcome::kFailure}) {
      Permit permit;
      ASSERT_TRUE(IsAdmitted(Admit(slot, index, 0, CoarseNowNs(), caller, &permit)));
      Complete(slot, &permit, o, 1'000'000, CoarseNowNs(), caller);
      while (!MsReached(NsToMs32(CoarseNowNs()), created_ms + 1)) {
      }
    }
    // A round kept from the CPU for most of a window (a loaded machine stops a process for
    // hundreds of milliseconds; stopped for 0.6 s in every 0.7 s, 8 to 12 rounds of 200 failed)
    // lets its first calls age out of the window before its last: the breaker rightly stays
    // closed. Such a round says nothing of the creation, and is not counted.
    if (CoarseNowNs() - first_ns >= uint64_t{p.window_ms - 2 * p.window_ms / 10} * 1'000'000u) {
      ++outlasted;
      continue;
    }
    not_tripped += BreakerWord::Decode(slot.breaker.load()).state != BreakerState::kOpen;
    ++rounds;
  }
  EXPECT_EQ(stamped_ahead, 0) << "of " << rounds + outlasted << " creations";
  EXPECT_EQ(not_tripped, 0) << "of " << rounds << " rounds, each of four calls, 3 failed ("
                            << outlasted << " more outlasted the window)";
  EXPECT_GE(rounds, 200);
}

// A new dependency's close is known only by its 32-bit time (no full time word), so a reader
// takes the window's floor from the close's age on its own clock. That floor is the period of
// the close's own millisecond; it was the reader's now less the age, so at the reader's
// sub-millisecond offset: with a period that is not a whole number of ms (window 913 ms in 3
// buckets), a boundary inside the creation's millisecond put the floor of a precise reader (the
// fleet's publishing, `retryctl status`) a period past the calls made right after the creation,
// and all of them vanished from its window (5 of 5 rounds). WindowAt finds such a shape for
// the coming millisecond.
struct WindowAt {
  uint32_t window_ms = 0, buckets = 0;
  uint64_t boundary_ns = 0;
};

bool FindWindowAt(uint64_t coarse_ns, WindowAt* out) {
  const uint64_t ms_end = (coarse_ns / 1'000'000u + 1) * 1'000'000u;
  for (uint32_t buckets : {3u, 6u, 7u, 9u, 11u, 12u, 13u, 14u}) {
    for (uint32_t w = 200; w <= 5000; ++w) {
      if (w / buckets < 50) continue;
      const uint64_t bucket_ns = uint64_t{w} * 1'000'000u / buckets;  // as breaker.cc Shape
      if (bucket_ns % 1'000'000u == 0) continue;
      const uint64_t b = (coarse_ns / bucket_ns + 1) * bucket_ns;
      // Room on both sides: the boundary at least 0.05 ms after the stamp and before the ms ends.
      if (b >= coarse_ns + 50'000 && b + 50'000 < ms_end) {
        *out = {w, buckets, b};
        return true;
      }
    }
  }
  return false;
}

// The coarse clock's time moves in whole ticks, so on a host whose clock is not slewed its
// sub-millisecond phase stays the same from tick to tick (739,237 ns at every tick, 4 ms apart,
// on one boot of the machine these tests run on). A phase late in its millisecond leaves no
// room for a boundary between a creation's stamp and the millisecond's end: from 0.9 ms none of
// FindWindowAt's shapes can fit, and from about 0.75 ms some ticks fit none, how many depending
// on the time since boot (373 of 20,000 ticks at 0.8 ms half an hour after boot).
// LaggingCoarseClock serves the coarse clock set back to the last time at a phase of 0.3 ms:
// less than a millisecond back, never backwards, a new value at every tick of a millisecond or
// more, and still behind the precise clock, as the coarse clock always is. The segment's stamps
// read it too: it is the clock CoarseNowNs calls.
constexpr uint64_t kChosenPhaseNs = 300'000;

int LaggingCoarseClock(clockid_t id, timespec* ts) {
  const int rc = clock_gettime(id, ts);
  uint64_t ns = uint64_t(ts->tv_sec) * 1'000'000'000u + uint64_t(ts->tv_nsec);
  ns = (ns - kChosenPhaseNs) / 1'000'000u * 1'000'000u + kChosenPhaseNs;
  ts->tv_sec = time_t(ns / 1'000'000'000u);
  ts->tv_nsec = long(ns % 1'000'000'000u);
  return rc;
}

class LaggingCoarseClockScope {
 public:
  LaggingCoarseClockScope() : old_(clock_internal::g_clock_gettime.exchange(&LaggingCoarseClock)) {}
  ~LaggingCoarseClockScope() { clock_internal::g_clock_gettime.store(old_); }

 private:
  const clock_internal::ClockGettime old_;
};

TEST(SegmentTest, AReaderOnEitherClockCountsTheCallsRightAfterACreation) {
  LaggingCoarseClockScope lagging;
  int tried = 0, shown = 0, unfit = 0;
  for (; tried < 200 && shown < 5; ++tried) {
    // Wait for a fresh coarse tick, then pick a shape with a boundary inside its ms.
    const uint64_t c0 = CoarseNowNs();
    while (CoarseNowNs() == c0) {
    }
    const uint64_t c = CoarseNowNs();
    WindowAt shape;
    if (!FindWindowAt(c, &shape)) {  // none at 0.3 ms in 20,000 ticks; the next tick, if so
      ++unfit;
      continue;
    }
    Policy p;
    p.window_ms = shape.window_ms;
    p.window_buckets = shape.buckets;
    p.min_calls = 1000;  // never trips here: only the counting is looked at
    std::unique_ptr<Segment> seg = Segment::CreatePrivate(2, 2, p);
    uint32_t index = 0;
    ASSERT_TRUE(seg->PutDependency("orders", p, &index).ok());
    DependencySlot& slot = *seg->dependency(index);
    Caller caller{RegisterProcess(*seg, getpid()), 0, 1};
    int made = 0;
    for (const Outcome o : {Outcome::kSuccess, Outcome::kFailure, Outcome::kSuccess,
                            Outcome::kFailure}) {
      Permit permit;
      ASSERT_TRUE(IsAdmitted(Admit(slot, index, 0, CoarseNowNs(), caller, &permit)));
      Complete(slot, &permit, o, 1'000'000, CoarseNowNs(), caller);
      ++made;
    }
    const uint32_t created_ms = BreakerWord::Decode(slot.breaker.load()).time_ms;
    if (created_ms != NsToMs32(c) || CoarseNowNs() != c) continue;  // the tick moved: again
    // The calls were all stamped at c, inside the creation's own tick: after the creation.
    // A precise reader a few ms later, at a sub-ms past the boundary's.
    const uint64_t boundary_sub = shape.boundary_ns % 1'000'000u;
    uint64_t r;
    do {
      r = PreciseNowNs();
    } while (r < c + 3'000'000u || r % 1'000'000u <= boundary_sub + 20'000);
    const WindowStats precise = ReadWindow(slot, r);
    const WindowStats coarse = ReadWindow(slot, CoarseNowNs());
    BuildOptions b;
    b.now_ns = r;
    SegmentStatus view;
    ASSERT_TRUE(BuildStatus(*seg, b, &view).ok());
    std::printf("window %ums / %u buckets (period %.6f ms): created at coarse %llu (sub-ms "
                "%llu ns), boundary at sub-ms %llu ns; %d calls; coarse reader counts %llu, "
                "precise reader at sub-ms %llu counts %llu (status shows %llu)\n",
                shape.window_ms, shape.buckets, double(shape.window_ms) / shape.buckets,
                (unsigned long long)c, (unsigned long long)(c % 1'000'000u),
                (unsigned long long)boundary_sub, made, (unsigned long long)coarse.calls,
                (unsigned long long)(r % 1'000'000u), (unsigned long long)precise.calls,
                (unsigned long long)view.dependencies.front().window.calls);
    EXPECT_EQ(coarse.calls, uint64_t(made));
    EXPECT_EQ(precise.calls, uint64_t(made)) << "calls made right after the creation hidden";
    ++shown;
  }
  EXPECT_GE(shown, 1) << "no round stayed within one tick in " << tried << " (" << unfit
                      << " ticks fit no shape)";
}

// The stripes a slot gets are the segment's, decided at its creation: one per CPU the kernel can
// bring online by default, any number up to kMaxStripes when asked. Another number is another
// capacity: the old segment is retired and replaced, as for another table size.
TEST(SegmentTest, TheStripesFollowTheHostAndAnotherCountIsAnotherCapacity) {
  std::unique_ptr<Segment> host = Segment::CreatePrivate(2, 2, Policy{});
  EXPECT_EQ(host->stripes_per_slot(), HostStripes());
  EXPECT_GE(HostStripes(), uint32_t(sysconf(_SC_NPROCESSORS_ONLN)));
  uint32_t index = 0;
  ASSERT_TRUE(host->PutDependency("orders", Policy{}, &index).ok());
  EXPECT_EQ(StripeCount(*host->dependency(index)), HostStripes());

  for (uint32_t stripes : {1u, 33u, 96u, kMaxStripes}) {
    std::unique_ptr<Segment> seg = Segment::CreatePrivate(3, 2, Policy{}, stripes);
    ASSERT_EQ(seg->stripes_per_slot(), stripes);
    EXPECT_EQ(seg->header().dependency_slot_size.load(), SlotStride(stripes));
    EXPECT_EQ(seg->header().stripes_per_slot.load(), stripes);
    // The slots follow each other at the stride, their stripes between them.
    EXPECT_EQ(reinterpret_cast<char*>(seg->dependency(1)) - reinterpret_cast<char*>(seg->dependency(0)),
              ptrdiff_t(SlotStride(stripes)));
    ASSERT_TRUE(seg->PutDependency("a", Policy{}, &index).ok());
    ASSERT_TRUE(seg->PutDependency("b", Policy{}, &index).ok());
    DependencySlot& b = *seg->dependency(index);
    EXPECT_EQ(StripeCount(b), stripes);
    // The last stripe of one slot ends where the next slot begins.
    DependencySlot& a = *seg->dependency(uint32_t(seg->Find("a")));
    EXPECT_EQ(reinterpret_cast<char*>(&StripeAt(a, stripes - 1) + 1), reinterpret_cast<char*>(&b));
    EXPECT_TRUE(Segment::Validate(&seg->header(), SegmentSize(3, 2, stripes)).ok());
  }

  testing::NamedSegment first("stripes-capacity");
  CreateOptions opt;
  opt.name = first.name;
  opt.max_dependencies = 16;
  opt.max_processes = 64;
  opt.stripes = first.seg->stripes_per_slot() + 1;
  std::unique_ptr<Segment> fresh;
  bool adopted = true;
  std::string note;
  ASSERT_TRUE(Segment::CreateOrAdopt(opt, &fresh, &adopted, &note).ok());
  EXPECT_FALSE(adopted);
  EXPECT_NE(note.find(" stripes a dependency): retired"), std::string::npos) << note;
  EXPECT_EQ(first.seg->header().retired.load(), 1u);
  EXPECT_EQ(fresh->stripes_per_slot(), opt.stripes);

  opt.stripes = kMaxStripes + 1;
  EXPECT_EQ(Segment::CreateOrAdopt(opt, &fresh, &adopted, &note).code(),
            Status::Code::kInvalidArgument);
}

// A stripe count scribbled in a slot reaches at most kMaxStripes stripes past it: the segment's
// room keeps every one of them inside the mapping, and the readers that fold them (counters,
// deposits, the window, the latency histogram) read what is there without faulting.
TEST(SegmentTest, AScribbledStripeCountNeverReachesPastTheSegment) {
  for (uint32_t stripes : {1u, 2u, 64u}) {
    std::unique_ptr<Segment> seg = Segment::CreatePrivate(2, 1, Policy{}, stripes);
    const uint64_t size = SegmentSize(2, 1, stripes);
    char* const begin = reinterpret_cast<char*>(&seg->header());
    DependencySlot& last = *seg->dependency(1);
    last.state.store(uint32_t(SlotState::kActive));
    last.stripe_count.store(~uint32_t{0});
    for (auto& word : last.stripes_written) word.store(~uint64_t{0});
    ASSERT_EQ(StripeCount(last), kMaxStripes);
    ASSERT_EQ(WrittenStripes(last).Count(), kMaxStripes);
    EXPECT_LE(reinterpret_cast<char*>(&StripeAt(last, kMaxStripes - 1) + 1), begin + size);
    EXPECT_EQ(ReadCounter(last, kSuccesses), 0u);
    EXPECT_EQ(PendingDeposits(last), 0u);
    EXPECT_EQ(ReadWindow(last, 5 * testing::kSec).calls, 0u);
    EXPECT_EQ(ReadLatency(last).Count(), 0u);
  }
}

// A reader folds only the stripes ever written (their map): on a host whose kernel can bring
// 1,024 CPUs online and where two call, a segment of 64 dependencies read in full (counters,
// deposits, windows, latencies) keeps the other stripes' pages out of memory, where every read
// of a memfd page would give it memory: whether the two are the first CPUs (a VM whose kernel
// could bring more online) or CPUs 1,000 and 1,001 (a container pinned far up a big host; a map
// of the highest stripe written gave memory to the thousand below it). A stripe written for the
// first time is folded from then on.
TEST(SegmentTest, TheStripesOfCpusThatNeverCalledGetNoMemory) {
  for (const uint16_t first : {uint16_t{0}, uint16_t{1000}}) {
    SCOPED_TRACE("CPUs " + std::to_string(first) + " and " + std::to_string(first + 1));
    CreateOptions opt;
    opt.name = "stripes-memory";
    opt.max_dependencies = 64;
    opt.max_processes = 8;
    opt.stripes = kMaxStripes;
    std::unique_ptr<Segment> seg;
    ASSERT_TRUE(Segment::CreateSealed(opt, &seg).ok());
    const uint64_t now_ns = 5 * testing::kSec;
    Caller caller{2, 0, 7};
    caller.stripe_mode = StripeMode::kAtomic;
    for (int d = 0; d < 64; ++d) {
      uint32_t index = 0;
      ASSERT_TRUE(seg->PutDependency("dep" + std::to_string(d), Policy{}, &index).ok());
      DependencySlot& slot = *seg->dependency(index);
      ASSERT_EQ(WrittenStripes(slot).Count(), 0u);
      for (const uint16_t cpu : {first, uint16_t(first + 1)}) {
        caller.OnCpu(cpu);
        Permit p;
        ASSERT_TRUE(IsAdmitted(Admit(slot, index, 0, now_ns, caller, &p)));
        Complete(slot, &p, Outcome::kSuccess, testing::kMs, now_ns, caller);
      }
      EXPECT_EQ(WrittenStripes(slot).Count(), 2u);
      EXPECT_EQ(ReadCounter(slot, kSuccesses), 2u);
      EXPECT_EQ(ReadWindow(slot, now_ns).calls, 2u);
      EXPECT_EQ(ReadLatency(slot).Count(), 2u);
      FoldDeposits(slot);
    }
    const long page = sysconf(_SC_PAGESIZE);
    const size_t pages = (seg->size() + size_t(page) - 1) / size_t(page);
    std::vector<unsigned char> resident(pages);
    ASSERT_EQ(mincore(&seg->header(), seg->size(), resident.data()), 0) << std::strerror(errno);
    const size_t in_memory = size_t(std::count_if(resident.begin(), resident.end(),
                                                  [](unsigned char r) { return r & 1; }));
    // Each dependency's slot and its two stripes: a few pages of the 49 it spans.
    std::cout << in_memory << " of " << pages << " pages in memory, CPUs " << first << " and "
              << first + 1 << " calling\n";
    EXPECT_LE(in_memory, size_t(64 * 3 + 8));

    // The first write to another stripe puts it in the map, and every reader folds it from then.
    DependencySlot& slot = *seg->dependency(0);
    const uint16_t other = first == 0 ? 1000 : 5;
    caller.OnCpu(other);
    Permit p;
    ASSERT_TRUE(IsAdmitted(Admit(slot, 0, 0, now_ns, caller, &p)));
    Complete(slot, &p, Outcome::kSuccess, testing::kMs, now_ns, caller);
    EXPECT_EQ(WrittenStripes(slot).Count(), 3u);
    EXPECT_TRUE(StripeWritten(slot, other));
    EXPECT_FALSE(StripeWritten(slot, other + 1));
    EXPECT_EQ(ReadCounter(slot, kSuccesses), 3u);
    EXPECT_EQ(ReadCounter(slot, kFirstAttempts), 3u);
    EXPECT_EQ(ReadWindow(slot, now_ns).calls, 3u);
    EXPECT_EQ(StripeAt(slot, other).first_attempts.load(), 1u);
  }
}

TEST(SegmentTest, ReplacesANewerLayoutButNeverAForeignObject) {
  testing::NamedSegment old("replace");
  old.seg->header().layout_version.store(kLayoutVersion + 1);
  CreateOptions opt;
  opt.name = old.name;
  opt.max_dependencies = 16;
  opt.max_processes = 64;
  std::unique_ptr<Segment> fresh;
  bool adopted = false;
  std::string note;
  ASSERT_TRUE(Segment::CreateOrAdopt(opt, &fresh, &adopted, &note).ok());
  EXPECT_EQ(old.seg->header().retired.load(), 1u);
  EXPECT_NE(note.find("newer"), std::string::npos) << note;

  const std::string foreign = testing::UniqueSegmentName("foreign");
  WriteRaw(foreign, std::string(8192, 'z'));
  opt.name = foreign;
  Status s = Segment::CreateOrAdopt(opt, &fresh, &adopted, &note);
  EXPECT_EQ(s.code(), Status::Code::kIncompatible);
  EXPECT_NE(s.message().find("by hand"), std::string::npos) << s.message();
  Segment::Remove(foreign);
}

TEST(SegmentTest, ModeIsAppliedDespiteUmask) {
  const mode_t old = umask(0077);
  testing::NamedSegment seg("mode");
  umask(old);
  // NamedSegment asks for 0600; ask for 0640 on a fresh one.
  shm::Segment::Remove(seg.name);
  CreateOptions opt;
  opt.name = seg.name;
  opt.mode = 0640;
  const mode_t saved = umask(0077);
  std::unique_ptr<Segment> s;
  bool adopted;
  std::string note;
  ASSERT_TRUE(Segment::CreateOrAdopt(opt, &s, &adopted, &note).ok());
  umask(saved);
  struct stat st;
  ASSERT_EQ(stat(("/dev/shm/" + seg.name).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
}

TEST(SegmentTest, DependencyTable) {
  testing::NamedSegment seg("table", /*deps=*/2);
  Policy p;
  uint32_t a, b, c;
  EXPECT_EQ(seg.seg->PutDependency("bad name!", p, &a).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(seg.seg->PutDependency(std::string(48, 'x'), p, &a).code(), Status::Code::kInvalidArgument);
  ASSERT_TRUE(seg.seg->PutDependency("a", p, &a).ok());
  ASSERT_TRUE(seg.seg->PutDependency("b.svc:8080", p, &b).ok());
  EXPECT_NE(a, b);
  EXPECT_EQ(seg.seg->PutDependency("c", p, &c).code(), Status::Code::kFull);
  // A policy change keeps the slot and its state.
  seg.seg->dependency(a)->counters[kFailures].store(5);
  p.min_calls = 77;
  ASSERT_TRUE(seg.seg->PutDependency("a", p, &c).ok());
  EXPECT_EQ(c, a);
  EXPECT_EQ(seg.seg->dependency(a)->policy.min_calls.load(), 77u);
  EXPECT_EQ(seg.seg->dependency(a)->counters[kFailures].load(), 5u);
  // Retired: not found, and its slot can go to a new name with a new generation.
  const uint32_t gen = seg.seg->dependency(a)->generation.load();
  seg.seg->Retire(a);
  EXPECT_EQ(seg.seg->Find("a"), -1);
  ASSERT_TRUE(seg.seg->PutDependency("c", p, &c).ok());
  EXPECT_EQ(c, a);
  EXPECT_EQ(ReadName(*seg.seg->dependency(c)), "c");
  EXPECT_NE(seg.seg->dependency(c)->generation.load(), gen);
}

TEST(SegmentTest, OnTheFlyCreationFollowsTheDaemonsSwitch) {
  testing::NamedSegment seg("onthefly", /*deps=*/1);
  uint32_t i;
  ASSERT_TRUE(seg.seg->CreateOnTheFly("first", &i).ok());
  EXPECT_EQ(seg.seg->CreateOnTheFly("second", &i).code(), Status::Code::kFull);
  EXPECT_EQ(seg.seg->header().table_full_events.load(), 1u);
  seg.seg->header().flags.store(0);
  EXPECT_EQ(seg.seg->CreateOnTheFly("third", &i).code(), Status::Code::kNotFound);
  EXPECT_EQ(seg.seg->header().unknown_dependency_events.load(), 1u);
  ASSERT_TRUE(seg.seg->CreateOnTheFly("first", &i).ok());  // existing names still resolve
}

TEST(SegmentTest, ValidateNeverReadsPastTheBuffer) {
  // Every prefix length of a valid header: refused, never read beyond `size`.
  testing::NamedSegment seg("prefix");
  const auto* base = reinterpret_cast<const char*>(&seg.seg->header());
  for (uint64_t n = 0; n < sizeof(SegmentHeader) + 64; n += 8) {
    std::unique_ptr<uint64_t[]> copy(new uint64_t[n / 8 + 1]);
    std::memcpy(copy.get(), base, n);
    EXPECT_FALSE(Segment::Validate(copy.get(), n).ok()) << n;
  }
}

// --- The sealed segment (CreateSealed, AttachFd) ------------------------------------------

std::unique_ptr<Segment> SealedSegment() {
  CreateOptions opt;
  opt.name = "sealed-test";
  opt.max_dependencies = 4;
  opt.max_processes = 4;
  std::unique_ptr<Segment> seg;
  Status s = Segment::CreateSealed(opt, &seg);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return seg;
}

// No holder of the descriptor can change the size: truncating to 0 or growing it is refused
// by the kernel, on the daemon's own descriptor and on a copy a worker received.
TEST(SealedSegmentTest, NoHolderCanShrinkOrGrowIt) {
  std::unique_ptr<Segment> seg = SealedSegment();
  ASSERT_NE(seg, nullptr);
  const off_t size = off_t(seg->size());
  const int copy = dup(seg->fd());
  for (const int fd : {seg->fd(), copy}) {
    EXPECT_NE(ftruncate(fd, 0), 0);
    EXPECT_EQ(errno, EPERM);
    EXPECT_NE(ftruncate(fd, size * 2), 0);
    EXPECT_EQ(errno, EPERM);
    EXPECT_NE(fallocate(fd, 0, 0, size * 2), 0);
    EXPECT_NE(fcntl(fd, F_ADD_SEALS, 0), 0) << "the seals themselves are sealed";
  }
  struct stat st;
  ASSERT_EQ(fstat(copy, &st), 0);
  EXPECT_EQ(st.st_size, size);
  // The mapping is whole after the attempts: its last byte reads.
  EXPECT_EQ(reinterpret_cast<volatile char*>(&seg->header())[size - 1], 0);
  close(copy);
}

TEST(SealedSegmentTest, AttachFdMapsTheSameMemory) {
  std::unique_ptr<Segment> seg = SealedSegment();
  ASSERT_NE(seg, nullptr);
  std::unique_ptr<Segment> other;
  ASSERT_TRUE(Segment::AttachFd(dup(seg->fd()), Access::kReadWrite, "copy", &other).ok());
  seg->header().heartbeat_ns.store(4242);
  EXPECT_EQ(other->header().heartbeat_ns.load(), 4242u);
  EXPECT_EQ(other->max_dependencies(), 4u);
}

TEST(SealedSegmentTest, AReadOnlyPeerDescriptorMapsReadOnly) {
  std::unique_ptr<Segment> seg = SealedSegment();
  ASSERT_NE(seg, nullptr);
  const int ro = seg->PeerDescriptor(Access::kReadOnly);
  ASSERT_GE(ro, 0) << std::strerror(errno);
  EXPECT_EQ(fcntl(ro, F_GETFL) & O_ACCMODE, O_RDONLY);
  std::unique_ptr<Segment> reader;
  const int ro_copy = dup(ro);
  ASSERT_TRUE(Segment::AttachFd(ro, Access::kReadOnly, "ro", &reader).ok());
  EXPECT_TRUE(reader->read_only());
  // A read-only descriptor cannot be mapped for writing.
  EXPECT_EQ(mmap(nullptr, seg->size(), PROT_READ | PROT_WRITE, MAP_SHARED, ro_copy, 0), MAP_FAILED);
  close(ro_copy);
}

TEST(SealedSegmentTest, AnUnsealedObjectIsRefused) {
  const int fd = memfd_create("unsealed", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 1 << 20), 0);
  std::unique_ptr<Segment> seg;
  const Status s = Segment::AttachFd(fd, Access::kReadWrite, "unsealed", &seg);
  EXPECT_EQ(s.code(), Status::Code::kIncompatible);
  EXPECT_NE(s.message().find("not sealed"), std::string::npos) << s.message();
}

// Invariant (dependency_table.h): a create lock word of 0 means free. No stamp is 0, at any
// time; a creator leaves the word 0 when it is done; and a creator that finds the word taken
// by a running holder refuses after its wait rather than create without the lock.
TEST(SegmentTest, TheCreateLockWordIsFreeExactlyWhenZero) {
  for (uint32_t now_ms : {0u, 1u, 0x7FFF'FFFFu, 0x8000'0000u, 0xFFFF'FFFFu}) {
    EXPECT_NE(CreateLockStamp(now_ms), 0u) << now_ms;
  }
  std::unique_ptr<Segment> seg = Segment::CreatePrivate(4, 4, Policy{});
  uint32_t index = 0;
  ASSERT_TRUE(seg->PutDependency("a", Policy{}, &index).ok());
  EXPECT_EQ(seg->header().create_lock.load(), 0u);
  ASSERT_TRUE(seg->CreateOnTheFly("b", &index).ok());
  EXPECT_EQ(seg->header().create_lock.load(), 0u);

  // Held by a running process (this one): the word is not free, and nothing is created.
  const uint64_t held = CreateLockStamp(NsToMs32(PreciseNowNs()));
  seg->header().create_lock.store(held);
  const Status s = seg->PutDependency("c", Policy{}, &index, /*lock_wait_ms=*/50);
  EXPECT_EQ(s.code(), Status::Code::kIoError) << s.ToString();
  EXPECT_EQ(seg->Find("c"), -1);
  EXPECT_EQ(seg->header().create_lock.load(), held);
  seg->header().create_lock.store(0);
  EXPECT_TRUE(seg->PutDependency("c", Policy{}, &index, 50).ok());
}

// dependency_table.h: Find never takes the create lock: it finds an active name at once while
// another creator holds the lock, and leaves the lock word as it was.
TEST(SegmentTest, FindNeverTakesTheCreateLock) {
  std::unique_ptr<Segment> seg = Segment::CreatePrivate(4, 4, Policy{});
  uint32_t index = 0;
  ASSERT_TRUE(seg->PutDependency("orders", Policy{}, &index).ok());
  const uint64_t held = CreateLockStamp(NsToMs32(PreciseNowNs()));
  seg->header().create_lock.store(held);
  // Waiting for the lock would sleep a millisecond at a time; a preemption is not a sleep.
  const uint64_t waits = testing::ThreadWaits();
  EXPECT_EQ(seg->Find("orders"), int32_t(index));
  EXPECT_EQ(seg->Find("missing"), -1);
  EXPECT_LE(testing::ThreadWaits() - waits, 1u) << "Find waited for the create lock";
  EXPECT_EQ(seg->header().create_lock.load(), held);
}

// segment.h: dependency() and process() return nullptr for an index out of range, and
// process_high_water() never exceeds the capacity, whatever the header's word says.
TEST(SegmentTest, AccessorsAreBoundsCheckedWhateverTheHeaderSays) {
  std::unique_ptr<Segment> seg = Segment::CreatePrivate(3, 5, Policy{});
  EXPECT_NE(seg->dependency(2), nullptr);
  EXPECT_EQ(seg->dependency(3), nullptr);
  EXPECT_EQ(seg->dependency(UINT32_MAX), nullptr);
  EXPECT_NE(seg->process(4), nullptr);
  EXPECT_EQ(seg->process(5), nullptr);
  EXPECT_EQ(seg->process(UINT32_MAX), nullptr);
  seg->header().process_high_water.store(UINT32_MAX);
  EXPECT_EQ(seg->process_high_water(), 5u);
}

}  // namespace
}  // namespace retryd::shm
