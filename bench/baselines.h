// bench/baselines.h: what hosts use today instead of a lock-free shared segment, set up so that
// `retryd_bench` can time one admission through each of them in the same run as retryd:
//
//   MutexTokenBucket  a token bucket under a robust, process-shared pthread mutex in shared
//                     memory (the usual "shared memory + lock" design)
//   SysvSemaphore     a SysV semaphore taken and given back with SEM_UNDO (Semian's bulkhead)
//   TokenServer       a forked process answering 1-byte token requests over a Unix-domain
//                     stream socket (how cluster token servers work, minus the network)
//   RedisTokenBucket  a token bucket in a Lua script run with EVALSHA (hiredis) against a
//                     redis-server this class starts on a Unix socket in a temp dir and stops
//
// Every bucket is sized so that it never runs dry during a run: the cost measured is the cost
// of a granted token. Setup failures are returned as a message, never thrown.
// Thread safety: MutexTokenBucket and SysvSemaphore are thread- and process-safe; TokenServer
// and RedisTokenBucket serve one calling thread.
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
