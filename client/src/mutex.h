// client/src/mutex.h: the client's mutex, with clang's thread-safety annotations.
//
// libstdc++'s std::mutex carries no capability attribute, so clang's -Wthread-safety cannot
// check what it guards. `Mutex` is a std::mutex that does; `MutexLock` holds one for a scope
// and may let go of it in between (`Unlock` / `Lock`) around a wait that must not happen under
// it. Members say which mutex guards them with `GUARDED_BY(mu_)`, functions what they need
// with `REQUIRES(mu_)` or `EXCLUDES(mu_)`; under gcc the annotations expand to nothing.
// Thread safety: `Mutex` is thread-safe; a `MutexLock` belongs to the thread that made it.
#pragma once

#include <mutex>

#if defined(__clang__)
#define RETRYD_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define RETRYD_THREAD_ANNOTATION(x)
#endif

#define CAPABILITY(x) RETRYD_THREAD_ANNOTATION(capability(x))
#define SCOPED_CAPABILITY RETRYD_THREAD_ANNOTATION(scoped_lockable)
#define GUARDED_BY(x) RETRYD_THREAD_ANNOTATION(guarded_by(x))
#define PT_GUARDED_BY(x) RETRYD_THREAD_ANNOTATION(pt_guarded_by(x))
#define REQUIRES(...) RETRYD_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) RETRYD_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define ACQUIRE(...) RETRYD_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) RETRYD_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define NO_THREAD_SAFETY_ANALYSIS RETRYD_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace retryd::internal {

class CAPABILITY("mutex") Mutex {
 public:
  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }

 private:
  std::mutex mu_;
};

class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() RELEASE() {
    if (held_) mu_->Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  // Unlock lets go of the mutex before the scope ends; Lock takes it again. Not reentrant.
  void Unlock() RELEASE() {
    mu_->Unlock();
    held_ = false;
  }
  void Lock() ACQUIRE() {
    mu_->Lock();
    held_ = true;
  }

 private:
  Mutex* const mu_;
  bool held_ = true;
};

}  // namespace retryd::internal
