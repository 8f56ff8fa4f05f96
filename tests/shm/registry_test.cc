// The process registry: the owner word's encoding, and registration writing it.
#include "shm/registry.h"

#include <unistd.h>

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

}  // namespace
}  // namespace retryd::shm
