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

#include "shm/layout.h"
#include "shm/policy.h"

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

// InitRobustSharedMutex: a mutex for processes that share the mapping, which the next locker
// recovers (EOWNERDEAD) when its holder dies.
void InitRobustSharedMutex(pthread_mutex_t* mu) {
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(mu, &attr);
  pthread_mutexattr_destroy(&attr);
}

}  // namespace

// --- MutexTokenBucket --------------------------------------------------------------------

MutexTokenBucket::MutexTokenBucket() {
  void* p = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) abort();
  shared_ = static_cast<Shared*>(p);
  InitRobustSharedMutex(&shared_->mu);
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

// --- MutexAdmission ----------------------------------------------------------------------

namespace {

enum BreakerState : uint32_t { kClosed = 0, kOpen = 1, kHalfOpen = 2 };
constexpr uint64_t kMilliPerToken = 1000;

void LockRobust(pthread_mutex_t* mu) {
  const int rc = pthread_mutex_lock(mu);
  // The dead holder left each field valid on its own, if not all of its update: carry on.
  if (rc == EOWNERDEAD) {
    pthread_mutex_consistent(mu);
  } else if (rc != 0) {
    abort();
  }
}

bool IsAdmitted(MutexAdmission::Decision d) {
  return d == MutexAdmission::Decision::kAdmitted || d == MutexAdmission::Decision::kAdmittedProbe;
}

}  // namespace

struct MutexAdmission::Shared {
  pthread_mutex_t mu;
  // The policy (shm::Policy{}), fixed at construction.
  uint32_t retry_ratio_milli, min_retries_per_sec, retry_burst;
  uint32_t bucket_ms, window_buckets, min_calls, failure_rate_pct;
  uint32_t open_for_ms, open_for_max_ms, open_jitter_ms, half_open_probes, close_after;
  // Retry budget.
  uint64_t tokens_milli;
  uint64_t refilled_ms;  // when the floor refill was last added
  // Breaker.
  uint32_t state, reopens, probes_in_flight, probe_successes;
  uint32_t seq;  // +1 on every transition
  uint32_t rng;  // xorshift state for the open period's jitter
  uint64_t open_until_ms;
  struct Bucket {
    uint64_t period;  // bucket-length periods of the clock
    uint32_t calls, failures;
  } buckets[shm::kMaxBuckets];
  // Counters.
  uint64_t first_attempts, retries_granted, successes, failures, rejected;

  // The steps below run under `mu`.
  void Open(uint64_t now_ms, uint32_t next_reopens) {
    const uint64_t cap = std::max(open_for_max_ms, open_for_ms);
    const uint64_t scaled = next_reopens >= 31 ? cap : std::min(cap, uint64_t{open_for_ms} << next_reopens);
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    state = kOpen;
    reopens = next_reopens;
    open_until_ms = now_ms + scaled + rng % (uint64_t{open_jitter_ms} + 1);
    ++seq;
  }

  Decision AdmitBreaker(uint64_t now_ms) {
    if (state == kOpen) {
      if (now_ms < open_until_ms) return Decision::kRejectedOpen;
      state = kHalfOpen;
      probes_in_flight = 0;
      probe_successes = 0;
      ++seq;
    }
    if (probes_in_flight >= half_open_probes) return Decision::kRejectedHalfOpenBusy;
    ++probes_in_flight;
    return Decision::kAdmittedProbe;
  }

  bool WithdrawRetry(uint64_t now_ms) {
    const uint64_t cap = uint64_t{retry_burst} * kMilliPerToken;
    if (now_ms > refilled_ms) {
      // One token per second is one thousandth per ms.
      tokens_milli = std::min(cap, tokens_milli + (now_ms - refilled_ms) * min_retries_per_sec);
      refilled_ms = now_ms;
    }
    if (tokens_milli < kMilliPerToken) return false;
    tokens_milli -= kMilliPerToken;
    return true;
  }

  void RecordOutcome(bool failure, uint64_t now_ms) {
    const uint64_t period = now_ms / bucket_ms;
    Bucket& b = buckets[period % window_buckets];
    if (b.period != period) b = Bucket{period, 0, 0};
    ++b.calls;
    if (!failure) return;
    ++b.failures;
    uint64_t calls = 0, failed = 0;
    for (uint32_t i = 0; i < window_buckets; ++i) {
      const Bucket& w = buckets[i];
      if (w.period <= period && w.period + window_buckets > period) {
        calls += w.calls;
        failed += w.failures;
      }
    }
    if (calls > 0 && calls >= min_calls && failed * 100 >= uint64_t{failure_rate_pct} * calls) {
      Open(now_ms, 0);
    }
  }

  void CompleteProbe(bool failure, uint64_t now_ms, uint32_t probe_seq) {
    if (state != kHalfOpen || seq != probe_seq) return;  // its half-open is over
    --probes_in_flight;
    if (failure) {
      Open(now_ms, std::min<uint32_t>(63, reopens + 1));
    } else if (++probe_successes >= close_after) {
      state = kClosed;
      reopens = 0;
      ++seq;
      std::memset(buckets, 0, sizeof(buckets));
    }
  }
};

MutexAdmission::MutexAdmission() {
  void* p = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) abort();
  shared_ = static_cast<Shared*>(p);  // zero-filled: breaker closed, window and counters empty
  InitRobustSharedMutex(&shared_->mu);
  const shm::Policy policy = shm::Clamped(shm::Policy{});
  Shared& s = *shared_;
  s.retry_ratio_milli = policy.retry_ratio_milli;
  s.min_retries_per_sec = policy.min_retries_per_sec;
  s.retry_burst = policy.retry_burst;
  s.window_buckets = policy.window_buckets;
  s.bucket_ms = std::max<uint32_t>(1, policy.window_ms / policy.window_buckets);
  s.min_calls = policy.min_calls;
  s.failure_rate_pct = policy.failure_rate_pct;
  s.open_for_ms = policy.open_for_ms;
  s.open_for_max_ms = policy.open_for_max_ms;
  s.open_jitter_ms = policy.open_jitter_ms;
  s.half_open_probes = policy.half_open_probes;
  s.close_after = policy.close_after;
  s.tokens_milli = uint64_t{policy.retry_burst} * kMilliPerToken;
  s.refilled_ms = CoarseNowNs() / 1'000'000u;
  s.rng = 0x9E3779B9u;
}

MutexAdmission::~MutexAdmission() {
  pthread_mutex_destroy(&shared_->mu);
  munmap(shared_, sizeof(Shared));
}

bool MutexAdmission::Admit(uint32_t attempt, Permit* permit) {
  Shared& s = *shared_;
  // A retry always needs the time; a first attempt only when the breaker is not closed.
  uint64_t now_ms = attempt > 0 ? CoarseNowNs() / 1'000'000u : 0;
  LockRobust(&s.mu);
  Decision d = Decision::kAdmitted;
  if (s.state != kClosed) {
    if (now_ms == 0) now_ms = CoarseNowNs() / 1'000'000u;
    d = s.AdmitBreaker(now_ms);
  }
  if (IsAdmitted(d)) {
    if (attempt == 0) {
      const uint64_t cap = uint64_t{s.retry_burst} * kMilliPerToken;
      if (s.tokens_milli < cap) s.tokens_milli = std::min(cap, s.tokens_milli + s.retry_ratio_milli);
      ++s.first_attempts;
    } else if (s.WithdrawRetry(now_ms)) {
      ++s.retries_granted;
    } else {
      if (d == Decision::kAdmittedProbe) --s.probes_in_flight;
      d = Decision::kRejectedBudgetEmpty;
    }
  }
  if (!IsAdmitted(d)) ++s.rejected;
  permit->decision = d;
  permit->breaker_seq = s.seq;
  permit->active = IsAdmitted(d);
  pthread_mutex_unlock(&s.mu);
  return permit->active;
}

void MutexAdmission::Complete(Permit* permit, bool failure) {
  if (!permit->active) return;
  permit->active = false;
  const uint64_t now_ms = CoarseNowNs() / 1'000'000u;
  Shared& s = *shared_;
  LockRobust(&s.mu);
  if (permit->decision == Decision::kAdmittedProbe) {
    s.CompleteProbe(failure, now_ms, permit->breaker_seq);
  } else if (s.state == kClosed) {
    s.RecordOutcome(failure, now_ms);
  }
  ++(failure ? s.failures : s.successes);
  pthread_mutex_unlock(&s.mu);
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
