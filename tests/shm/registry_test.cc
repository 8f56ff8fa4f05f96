// The process registry: the owner word's encoding, and registration writing it.
#include "shm/registry.h"

#include <unistd.h>

#include <utility>
#include <vector>

#include <gtest/gtest.h>

namespace retryd::shm {
namespace {

TEST(ProcessOwnerTest, EncodesPidLowAndStateHigh) {
  const ProcessOwner live{pid_t(4'194'303), ProcessState::kLive};
  EXPECT_EQ(live.Encode(), uint64_t{4'194'303} | (uint64_t{2} << 32));
  const ProcessOwner back = ProcessOwner::Decode(live.Encode());
  EXPECT_EQ(back.pid, live.pid);
  EXPECT_TRUE(back.live());
  const ProcessOwner claiming = ProcessOwner::Decode(uint64_t{77} | (uint64_t{1} << 32));
  EXPECT_EQ(claiming.pid, 77);
  EXPECT_EQ(claiming.state, ProcessState::kClaiming);
  EXPECT_FALSE(claiming.live());
  // A scribbled state is neither claiming nor live.
  EXPECT_FALSE(ProcessOwner::Decode(uint64_t{77} | (uint64_t{9} << 32)).live());
}

TEST(ProcessOwnerTest, RegisterPublishesALiveOwnerAndUnregisterFreesIt) {
  std::unique_ptr<Segment> seg = Segment::CreatePrivate(1, 2, Policy{});
  const uint16_t id = RegisterProcess(*seg, getpid());
  ASSERT_EQ(id, 1);
  const ProcessOwner owner = ProcessOwner::Decode(seg->process(0)->owner.load());
  EXPECT_EQ(owner.pid, getpid());
  EXPECT_TRUE(owner.live());
  UnregisterProcess(*seg, id, getpid());
  EXPECT_EQ(seg->process(0)->owner.load(), 0u);
}

// Invariant (registry.h): a slot's start time is valid only while its state is kLive. A slot
// being claimed may still hold the start time of the slot's previous owner; the reclaim must
// judge it by its pid alone, not find it dead by that stale start time.
TEST(ProcessOwnerTest, AStartTimeCountsOnlyWhileTheSlotIsLive) {
  std::unique_ptr<Segment> seg = Segment::CreatePrivate(1, 2, Policy{});
  const uint16_t id = RegisterProcess(*seg, getpid());
  ASSERT_EQ(id, 1);
  ProcessSlot& slot = *seg->process(0);
  const uint64_t real_start = slot.start_time.load();
  std::vector<std::pair<pid_t, uint64_t>> asked;
  const AliveFn alive = [&](pid_t pid, uint64_t start) {
    asked.push_back({pid, start});
    return pid == getpid() && (start == 0 || start == real_start);
  };
  // A previous owner's start time, left while the slot is claimed again (and while its state
  // word is scribbled: neither claiming nor live).
  slot.start_time.store(real_start + 12'345);
  for (ProcessState state : {ProcessState::kClaiming, ProcessState(9)}) {
    slot.owner.store(ProcessOwner{getpid(), state}.Encode());
    asked.clear();
    EXPECT_EQ(ReclaimDeadProcesses(*seg, alive), 0u);
    EXPECT_NE(slot.owner.load(), 0u) << "state " << uint32_t(state);
    ASSERT_EQ(asked.size(), 1u);
    EXPECT_EQ(asked[0].second, 0u) << "state " << uint32_t(state);
  }
  // Live, the start time counts: a different one is a recycled pid, and the slot is freed.
  slot.owner.store(ProcessOwner{getpid(), ProcessState::kLive}.Encode());
  EXPECT_EQ(ReclaimDeadProcesses(*seg, alive), 0u);
  EXPECT_EQ(slot.owner.load(), 0u);
}

}  // namespace
}  // namespace retryd::shm
