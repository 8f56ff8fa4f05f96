#include "bench/baselines.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/sem.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#ifdef RETRYD_BENCH_HAVE_HIREDIS
#include <hiredis/hiredis.h>
#endif

namespace retryd::bench {
namespace {

std::string SysError(const std::string& what) { return what + ": " + std::strerror(errno); }

uint64_t CoarseNowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000u + uint64_t(ts.tv_nsec);
}

// Big enough that no run can drain it: one token per ns, a billion tokens of burst.
constexpr uint64_t kBurstMilli = 1'000'000'000ull * 1000;
constexpr uint64_t kRefillMilliPerNs = 1000;

// Reaps `pid` within ~2 s of SIGTERM, then SIGKILLs it.
void StopChild(pid_t pid) {
  if (pid <= 0) return;
  kill(pid, SIGTERM);
  for (int i = 0; i < 200; ++i) {
    if (waitpid(pid, nullptr, WNOHANG) == pid) return;
    usleep(10'000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

}  // namespace

// --- MutexTokenBucket --------------------------------------------------------------------

MutexTokenBucket::MutexTokenBucket() {
  void* p = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) abort();
  shared_ = static_cast<Shared*>(p);
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&shared_->mu, &attr);
  pthread_mutexattr_destroy(&attr);
  shared_->tokens_milli = kBurstMilli;
  shared_->stamp_ns = CoarseNowNs();
}

MutexTokenBucket::~MutexTokenBucket() {
  pthread_mutex_destroy(&shared_->mu);
  munmap(shared_, sizeof(Shared));
}

bool MutexTokenBucket::TryAcquire() {
  const uint64_t now_ns = CoarseNowNs();
  if (pthread_mutex_lock(&shared_->mu) == EOWNERDEAD) pthread_mutex_consistent(&shared_->mu);
  if (now_ns > shared_->stamp_ns) {
    shared_->tokens_milli =
        std::min(kBurstMilli, shared_->tokens_milli + (now_ns - shared_->stamp_ns) * kRefillMilliPerNs);
    shared_->stamp_ns = now_ns;
  }
  const bool granted = shared_->tokens_milli >= 1000;
  if (granted) shared_->tokens_milli -= 1000;
  pthread_mutex_unlock(&shared_->mu);
  return granted;
}

// --- SysvSemaphore -----------------------------------------------------------------------

namespace {
union SemUn {  // the caller defines it on Linux (semctl(2))
  int val;
  semid_ds* buf;
  unsigned short* array;
};
}  // namespace

SysvSemaphore::SysvSemaphore(int count) {
  id_ = semget(IPC_PRIVATE, 1, IPC_CREAT | 0600);
  if (id_ < 0) {
    error_ = SysError("semget");
    return;
  }
  SemUn arg;
  arg.val = count;
  if (semctl(id_, 0, SETVAL, arg) < 0) {
    error_ = SysError("semctl SETVAL");
    semctl(id_, 0, IPC_RMID);
    id_ = -1;
  }
}

SysvSemaphore::~SysvSemaphore() {
  if (id_ >= 0) semctl(id_, 0, IPC_RMID);
}

bool SysvSemaphore::Acquire() {
  sembuf op{0, -1, SEM_UNDO};
  return semop(id_, &op, 1) == 0;
}

bool SysvSemaphore::Release() {
  sembuf op{0, +1, SEM_UNDO};
  return semop(id_, &op, 1) == 0;
}

// --- TokenServer -------------------------------------------------------------------------

TokenServer::TokenServer() {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) < 0) {
    error_ = SysError("socketpair");
    return;
  }
  pid_ = fork();
  if (pid_ < 0) {
    error_ = SysError("fork");
    close(fds[0]);
    close(fds[1]);
    return;
  }
  if (pid_ == 0) {
    // The server: one byte in, one byte ("granted") out, until the client hangs up.
    close(fds[0]);
    char c;
    for (;;) {
      const ssize_t n = read(fds[1], &c, 1);
      if (n == 0) _exit(0);
      if (n < 0) {
        if (errno == EINTR) continue;
        _exit(1);
      }
      c = 1;
      while (write(fds[1], &c, 1) < 0 && errno == EINTR) {
      }
    }
  }
  close(fds[1]);
  fd_ = fds[0];
}

TokenServer::~TokenServer() {
  if (fd_ >= 0) close(fd_);
  if (pid_ > 0) {
    // EOF ends the server; give it a moment before signalling.
    for (int i = 0; i < 100; ++i) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      usleep(10'000);
    }
    StopChild(pid_);
  }
}

bool TokenServer::RoundTrip() {
  char c = 0;
  if (write(fd_, &c, 1) != 1) return false;
  return read(fd_, &c, 1) == 1 && c == 1;
}

// --- RedisTokenBucket --------------------------------------------------------------------

namespace {

#ifdef RETRYD_BENCH_HAVE_HIREDIS
// KEYS[1]: the bucket. ARGV: burst (tokens), rate (tokens/s). Server time, so clients need no
// clock; the usual shape of a Redis rate limiter.
constexpr const char* kTokenBucketLua = R"lua(
local burst = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local s = redis.call('HMGET', KEYS[1], 'tokens', 'stamp')
local tokens = tonumber(s[1]) or burst
local stamp = tonumber(s[2]) or now
if now > stamp then tokens = math.min(burst, tokens + (now - stamp) * rate / 1000000) end
local granted = 0
if tokens >= 1 then
  tokens = tokens - 1
  granted = 1
end
redis.call('HSET', KEYS[1], 'tokens', tokens, 'stamp', now)
return granted
)lua";
#endif

[[maybe_unused]] std::string FindOnPath(const std::string& exe) {
  const char* path = getenv("PATH");
  std::string dirs = path && *path ? path : "/usr/local/bin:/usr/bin:/bin";
  dirs += ":/usr/sbin:/usr/local/sbin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    const std::string candidate = dirs.substr(start, end - start) + "/" + exe;
    if (end > start && access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return "";
}

}  // namespace

bool RedisTokenBucket::available() {
#ifdef RETRYD_BENCH_HAVE_HIREDIS
  return !FindOnPath("redis-server").empty();
#else
  return false;
#endif
}

#ifdef RETRYD_BENCH_HAVE_HIREDIS

RedisTokenBucket::RedisTokenBucket() {
  const std::string server = FindOnPath("redis-server");
  if (server.empty()) {
    error_ = "redis-server not installed";
    return;
  }
  char tmpl[] = "/tmp/retryd-bench-redis-XXXXXX";
  if (!mkdtemp(tmpl)) {
    error_ = SysError("mkdtemp");
    return;
  }
  dir_ = tmpl;
  const std::string sock = dir_ + "/redis.sock";
  std::vector<std::string> args = {server, "--port", "0", "--unixsocket", sock,
                                   "--unixsocketperm", "700", "--save", "", "--appendonly",
                                   "no", "--dir", dir_, "--logfile", dir_ + "/redis.log",
                                   "--daemonize", "no"};
  pid_ = fork();
  if (pid_ < 0) {
    error_ = SysError("fork");
    return;
  }
  if (pid_ == 0) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(server.c_str(), argv.data());
    _exit(127);
  }
  redisContext* c = nullptr;
  for (int i = 0; i < 500 && !c; ++i) {  // up to ~5 s for the server to listen
    if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
      pid_ = -1;
      error_ = "redis-server exited at start (see its log in " + dir_ + ")";
      return;
    }
    redisContext* attempt = redisConnectUnix(sock.c_str());
    if (attempt && !attempt->err) {
      c = attempt;
    } else {
      if (attempt) redisFree(attempt);
      usleep(10'000);
    }
  }
  if (!c) {
    error_ = "redis-server did not listen on " + sock + " within 5 s";
    return;
  }
  context_ = c;
  auto* reply = static_cast<redisReply*>(redisCommand(c, "SCRIPT LOAD %s", kTokenBucketLua));
  if (!reply || reply->type != REDIS_REPLY_STRING) {
    error_ = std::string("SCRIPT LOAD failed: ") + (reply && reply->str ? reply->str : c->errstr);
  } else {
    sha_.assign(reply->str, reply->len);
    ok_ = true;
  }
  if (reply) freeReplyObject(reply);
}

bool RedisTokenBucket::TryAcquire() {
  auto* c = static_cast<redisContext*>(context_);
  const char* args[6] = {"EVALSHA", sha_.c_str(), "1", "retryd-bench-bucket", "1000000000",
                         "1000000000"};
  auto* reply = static_cast<redisReply*>(redisCommandArgv(c, 6, args, nullptr));
  const bool granted = reply && reply->type == REDIS_REPLY_INTEGER && reply->integer == 1;
  if (reply) freeReplyObject(reply);
  return granted;
}

void RedisTokenBucket::Stop() {
  if (context_) redisFree(static_cast<redisContext*>(context_));
  context_ = nullptr;
  StopChild(pid_);
  pid_ = -1;
}

#else  // !RETRYD_BENCH_HAVE_HIREDIS

RedisTokenBucket::RedisTokenBucket() { error_ = "built without hiredis"; }
bool RedisTokenBucket::TryAcquire() { return false; }
void RedisTokenBucket::Stop() {}

#endif

RedisTokenBucket::~RedisTokenBucket() {
  Stop();
  if (!dir_.empty()) {
    for (const char* f : {"/redis.sock", "/redis.log", "/dump.rdb"}) unlink((dir_ + f).c_str());
    rmdir(dir_.c_str());
  }
}

}  // namespace retryd::bench
