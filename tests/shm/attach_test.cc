// The attach protocol's client side against listeners that misbehave: one that never accepts
// (a stopped daemon whose backlog is full) and one that accepts and never answers. Each attach
// gives up within its timeout with an error naming the socket, instead of hanging.
#include "shm/attach.h"

#include <fcntl.h>
#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "shm/clock.h"
#include "tests/shm/test_util.h"

namespace retryd::shm {
namespace {

class Listener {
 public:
  explicit Listener(int backlog) {
    path_ = "/tmp/retryd-attach-unit-" + std::to_string(getpid()) + ".sock";
    unlink(path_.c_str());
    fd_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path_.data(), path_.size());
    EXPECT_EQ(bind(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(fd_, backlog), 0);
  }
  ~Listener() {
    close(fd_);
    unlink(path_.c_str());
  }
  const std::string& path() const { return path_; }
  int fd() const { return fd_; }

 private:
  std::string path_;
  int fd_ = -1;
};

// A stopped daemon whose backlog is full: nobody takes the connection, said at once.
TEST(AttachThroughSocketTest, AListenerThatNeverAcceptsIsNotFoundAtOnce) {
  Listener l(0);
  // Fill the backlog with connections that are never accepted.
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, l.path().data(), l.path().size());
  std::vector<int> queued;
  for (int i = 0; i < 64; ++i) {
    const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
      close(fd);
      break;
    }
    queued.push_back(fd);
  }
  Attachment a;
  const uint64_t waits = retryd::testing::ThreadWaits();
  const Status s = AttachThroughSocket(l.path(), Access::kReadWrite, 300, &a);
  EXPECT_EQ(s.code(), Status::Code::kNotFound) << s.ToString();
  EXPECT_NE(s.message().find(l.path()), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("backlog is full"), std::string::npos) << s.message();
  EXPECT_LE(retryd::testing::ThreadWaits() - waits, 1u) << "it waited for the listener";
  for (const int fd : queued) close(fd);
}

TEST(AttachThroughSocketTest, AListenerThatNeverAnswersGivesUpWithinTheTimeout) {
  Listener l(16);
  Attachment a;
  bool no_answer = false;
  const Status s = AttachThroughSocket(l.path(), Access::kReadWrite, 300, &a, {}, &no_answer);
  EXPECT_EQ(s.code(), Status::Code::kIoError) << s.ToString();
  EXPECT_NE(s.message().find("no answer"), std::string::npos) << s.message();
  EXPECT_TRUE(no_answer);
}

// The two steps a worker takes: the hello goes out without waiting, the answer is looked for
// without waiting, and a listener that goes away is a hang-up (kNotFound), not a wait.
TEST(StartAttachTest, NeitherStepWaitsAndAHangUpIsNotFound) {
  auto l = std::make_unique<Listener>(16);
  int fd = -1;
  const uint64_t waits = retryd::testing::ThreadWaits();
  ASSERT_TRUE(StartAttach(l->path(), Access::kReadWrite, {}, &fd).ok());
  ASSERT_GE(fd, 0);
  Attachment a;
  bool answered = true;
  EXPECT_TRUE(PollAttach(fd, l->path(), Access::kReadWrite, 0, &a, &answered).ok());
  EXPECT_FALSE(answered);
  EXPECT_LE(retryd::testing::ThreadWaits() - waits, 1u) << "a step slept or blocked";
  const std::string path = l->path();
  l.reset();  // the listener closes with the hello in its backlog
  const Status s = PollAttach(fd, path, Access::kReadWrite, 10'000, &a, &answered);
  EXPECT_TRUE(answered);
  EXPECT_EQ(s.code(), Status::Code::kNotFound) << s.ToString();
  EXPECT_NE(s.message().find("hung up"), std::string::npos) << s.message();
}

// A socket the user may not connect to names the [daemon] keys that decide it. Root connects
// whatever the mode, so as root the worker is a child that runs as nobody.
TEST(StartAttachTest, APermissionRefusalNamesTheConfigKeys) {
  Listener l(16);
  ASSERT_EQ(chmod(l.path().c_str(), 0), 0);
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t child = fork();
  if (child == 0) {
    close(out[0]);
    if (geteuid() == 0 && (setgroups(0, nullptr) != 0 || setgid(65534) != 0 || setuid(65534) != 0)) {
      _exit(9);
    }
    int fd = -1;
    const Status s = StartAttach(l.path(), Access::kReadWrite, {}, &fd);
    const std::string text = std::to_string(int(s.code())) + " " + s.message();
    (void)!write(out[1], text.data(), text.size());
    _exit(0);
  }
  close(out[1]);
  std::string text;
  char buf[512];
  for (ssize_t n; (n = read(out[0], buf, sizeof buf)) > 0;) text.append(buf, size_t(n));
  close(out[0]);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child could not become nobody";
  EXPECT_EQ(text.substr(0, text.find(' ')), std::to_string(int(Status::Code::kPermissionDenied)))
      << text;
  EXPECT_NE(text.find("[daemon] group and mode"), std::string::npos) << text;
  EXPECT_EQ(text.find("socket_group"), std::string::npos) << text;
}

TEST(AttachThroughSocketTest, NothingListeningIsNotFound) {
  Attachment a;
  const Status s = AttachThroughSocket("/tmp/retryd-no-such-socket", Access::kReadOnly, 300, &a);
  EXPECT_EQ(s.code(), Status::Code::kNotFound) << s.ToString();
  EXPECT_NE(s.message().find("is retryd running?"), std::string::npos) << s.message();
}

// How a process that names nothing finds the daemon: the environment first, then the packaged
// daemon's socket if one is there, else the segment by name.
TEST(ResolveSocketTest, TheNamedThenTheEnvironmentThenThePackagedSocket) {
  unsetenv("RETRYD_SOCKET");
  unsetenv("RETRYD_SEGMENT");
  std::string packaged;
  {
    Listener daemon(1);
    packaged = daemon.path();
    EXPECT_EQ(ResolveSocket("", "", packaged.c_str()), packaged);
    EXPECT_EQ(ResolveSocket("/x.sock", "", packaged.c_str()), "/x.sock");
    EXPECT_EQ(ResolveSocket("", "seg", packaged.c_str()), "") << "a segment named is meant";
    setenv("RETRYD_SEGMENT", "seg", 1);
    EXPECT_EQ(ResolveSocket("", "", packaged.c_str()), "");
    setenv("RETRYD_SOCKET", "/env.sock", 1);
    EXPECT_EQ(ResolveSocket("", "", packaged.c_str()), "/env.sock");
    unsetenv("RETRYD_SOCKET");
    unsetenv("RETRYD_SEGMENT");
  }
  EXPECT_EQ(ResolveSocket("", "", packaged.c_str()), "") << "no socket there: by name";
  // A plain file at the path is no daemon's socket.
  close(open(packaged.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600));
  EXPECT_EQ(ResolveSocket("", "", packaged.c_str()), "");
  unlink(packaged.c_str());
}

}  // namespace
}  // namespace retryd::shm
