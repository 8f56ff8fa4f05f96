// bench/baselines.h: what hosts use today instead of a lock-free shared segment, set up so that
// `retryd_bench` can time one admission through each of them in the same run as retryd:
//
//   MutexTokenBucket  a token bucket under a robust, process-shared pthread mutex in shared
//                     memory (the usual "shared memory + lock" design), and nothing else
//   MutexAdmission    what a team would build itself for what retryd does: a retry budget, a
//                     bucketed sliding-window breaker and the counters, all under one robust,
//                     process-shared pthread mutex in shared memory (the fair baseline)
//   SysvSemaphore     a SysV semaphore taken and given back with SEM_UNDO (Semian's bulkhead)
//   TokenServer       a forked process answering 1-byte token requests over a Unix-domain
//                     stream socket (how cluster token servers work, minus the network)
//   RedisTokenBucket  a token bucket in a Lua script run with EVALSHA (hiredis) against a
//                     redis-server this class starts on a Unix socket in a temp dir and stops
//
// Every bucket is sized so that it never runs dry during a run: the cost measured is the cost
// of a granted token. Setup failures are returned as a message, never thrown.
// Thread safety: MutexTokenBucket, MutexAdmission and SysvSemaphore are thread- and
// process-safe (their state is in a MAP_SHARED mapping made by the constructor, so processes
// forked after it share one instance); TokenServer and RedisTokenBucket serve one calling thread.
#pragma once

#include <pthread.h>
#include <sys/types.h>

#include <cstdint>
#include <string>

namespace retryd::bench {

class MutexTokenBucket {
 public:
  MutexTokenBucket();
  ~MutexTokenBucket();
  MutexTokenBucket(const MutexTokenBucket&) = delete;
  MutexTokenBucket& operator=(const MutexTokenBucket&) = delete;
  // TryAcquire refills by elapsed time (CLOCK_MONOTONIC_COARSE, the clock retryd reads) and
  // takes one token under the lock; recovers the lock if its owner died holding it.
  bool TryAcquire();

 private:
  struct Shared {
    pthread_mutex_t mu;
    uint64_t tokens_milli;
    uint64_t stamp_ns;
  };
  Shared* shared_ = nullptr;
};

// MutexAdmission has the semantics of retryd's Admit + Complete for everything a first
// attempt, a retry and a probe touch, with the default policy (shm::Policy{}), so that its cost
// is what the same work costs under a lock rather than with retryd's atomics:
//   retry budget  a token bucket in thousandths: a first attempt deposits `retry_ratio` unless
//                 the bucket holds `retry_burst`; a retry refills `min_retries_per_sec` x the
//                 time since the last refill, capped at the burst, and withdraws one token
//   breaker       `window_buckets` buckets of window / window_buckets ms, each with its period,
//                 calls and failures; a failure on a closed breaker trips it when the window
//                 holds >= `min_calls` calls at a failure rate >= `failure_rate_threshold`.
//                 Closed / Open / HalfOpen as in shm/breaker.h: open for
//                 min(open_for x 2^reopens, open_for_max) + jitter, then `half_open_probes`
//                 probes at once; `close_after` probe successes close it (and clear the
//                 window), one probe failure reopens it
//   counters      first attempts, retries granted, successes, failures, rejections
// Like retryd's client, Admit reads no clock on a closed breaker and Complete reads
// CLOCK_MONOTONIC_COARSE once, before it locks. Admit and Complete each take the lock once:
// a caller holds no lock across its call.
// Left out (no first attempt on a healthy dependency touches them): the bulkhead, slow calls,
// probe timeouts, modes. A holder that dies in the critical section leaves the state as far as
// it got (each field valid on its own); the next locker marks the mutex consistent and goes on.
class MutexAdmission {
 public:
  enum class Decision {
    kAdmitted,
    kAdmittedProbe,
    kRejectedOpen,
    kRejectedHalfOpenBusy,
    kRejectedBudgetEmpty,
  };
  // What an attempt holds from Admit to Complete. Caller-owned.
  struct Permit {
    Decision decision = Decision::kRejectedOpen;
    uint32_t breaker_seq = 0;  // the breaker transition a probe was granted in
    bool active = false;       // admitted and not completed yet
  };

  // Maps the shared state and sets it up with the default policy, breaker closed and budget
  // full; aborts if mmap fails.
  MutexAdmission();
  ~MutexAdmission();
  MutexAdmission(const MutexAdmission&) = delete;
  MutexAdmission& operator=(const MutexAdmission&) = delete;

  // Admit decides whether attempt `attempt` (0: first attempt) may go out and fills *permit;
  // true when admitted. Follow every Admit with one Complete. Thread- and process-safe.
  bool Admit(uint32_t attempt, Permit* permit);
  // Complete records the outcome of an admitted attempt (a no-op for a rejected or completed
  // permit). Thread- and process-safe.
  void Complete(Permit* permit, bool failure);

 private:
  struct Shared;
  Shared* shared_ = nullptr;
};

class SysvSemaphore {
 public:
  // Creates a private semaphore with value `count`; ok() is false (with error()) on failure.
  explicit SysvSemaphore(int count);
  ~SysvSemaphore();
  SysvSemaphore(const SysvSemaphore&) = delete;
  SysvSemaphore& operator=(const SysvSemaphore&) = delete;
  bool ok() const { return id_ >= 0; }
  const std::string& error() const { return error_; }
  // Acquire and Release are one semop each, with SEM_UNDO so that a dying holder gives back.
  bool Acquire();
  bool Release();

 private:
  int id_ = -1;
  std::string error_;
};

class TokenServer {
 public:
  // Forks the server process; ok() is false (with error()) on failure.
  TokenServer();
  // Closes the socket (the server exits on EOF) and reaps the server.
  ~TokenServer();
  TokenServer(const TokenServer&) = delete;
  TokenServer& operator=(const TokenServer&) = delete;
  bool ok() const { return fd_ >= 0; }
  const std::string& error() const { return error_; }
  // RoundTrip sends one request byte and waits for the grant byte.
  bool RoundTrip();

 private:
  int fd_ = -1;
  pid_t pid_ = -1;
  std::string error_;
};

class RedisTokenBucket {
 public:
  // available() is false when redis-server is not installed (or hiredis was not built in).
  static bool available();
  // Starts redis-server on a Unix socket in a fresh temp dir, connects and loads the script;
  // ok() is false (with error()) on failure.
  RedisTokenBucket();
  // Disconnects, stops the server (SIGTERM, then SIGKILL) and removes the temp dir.
  ~RedisTokenBucket();
  RedisTokenBucket(const RedisTokenBucket&) = delete;
  RedisTokenBucket& operator=(const RedisTokenBucket&) = delete;
  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }
  // pid of the server, or -1 (for a signal handler that must kill it).
  pid_t pid() const { return pid_; }
  // The temp dir holding its socket and log ("" before it is made).
  const std::string& dir() const { return dir_; }
  // TryAcquire runs the token-bucket script once (EVALSHA); false on a denial or an error.
  bool TryAcquire();

 private:
  void Stop();
  [[maybe_unused]] void* context_ = nullptr;  // redisContext* (unused without hiredis)
  pid_t pid_ = -1;
  std::string dir_;
  std::string sha_;
  std::string error_;
  bool ok_ = false;
};

}  // namespace retryd::bench
