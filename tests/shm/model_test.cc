// The real dependency slot against the reference model (tests/shm/model/dependency_model.h),
// step by step, under random operations.
//
// Each shape drives one slot of a private segment through the real hot path and janitors
// (shm::Admit, Complete, ReclaimExpired, ReclaimOwner, Reset, mode and policy stores) and a
// DependencyModel through the same operations. Virtual processes of a few threads each (each
// thread a Caller of its process's owner id, running on one of four virtual CPUs' stripes or on
// the shared words, chosen anew for every call: stripes.h) admit first attempts and retries, hold permits
// across steps and complete them with random outcomes and latencies; processes die with their
// permits abandoned, and the daemon reaps some of them; the virtual clock creeps, jumps (up to a
// year, onto and across 2^32 ms wraps of the stored stamps), and steps back within the clock skew
// retry_budget.h tolerates. After every step the test compares the decision, every counter, the
// breaker word, the window's counts, the budget (word plus the stripes' deposits) and every lease
// word with the model, and
// checks the bounds of DESIGN.md: probes in flight of the current half-open <= half_open_probes,
// bulkhead leases <= bulkhead_limit, the budget never above its burst, and retries granted over
// any interval <= burst + ratio x first attempts + floor x seconds (retry_budget.h).
// The ModelRegressionTest cases at the end pin three disagreements the model found, each of
// which the real code then fixed: a reset in a bucket period with calls, a clock read that lags
// a close, and a breaker closed for a multiple of 2^32 ms.
//
// RETRYD_MODEL_STEPS sets the steps of each shape (default kDefaultSteps, a tenth of it under a
// sanitizer) and RETRYD_MODEL_SEED the seed of every shape; a failure names the shape, the seed
// and the step, and lists the last operations, so that
//   RETRYD_MODEL_SEED=<seed> RETRYD_MODEL_STEPS=<step + 1> shm_model_test --gtest_filter=*<shape>
// replays it exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "shm/admission.h"
#include "shm/breaker.h"
#include "shm/leases.h"
#include "shm/registry.h"
#include "shm/retry_budget.h"
#include "shm/segment.h"
#include "tests/sanitized.h"
#include "tests/shm/model/dependency_model.h"
#include "tests/shm/test_util.h"

namespace retryd::shm {
namespace {

using model::DependencyModel;
using model::ModelPermit;
using model::ModelThread;

constexpr bool kSanitized = kSanitizedBuild;

constexpr uint64_t kDefaultSteps = 1'000'000;

constexpr uint64_t kNsPerMs = 1'000'000;
constexpr uint64_t kWrapMs = uint64_t{1} << 32;
constexpr uint64_t kDayMs = 86'400'000;
constexpr uint64_t kClockCeilingMs = 300 * 365 * kDayMs;
// How far the clock may read behind the latest time any process read: the skew the budget
// tolerates (retry_budget.h), with room to spare.
constexpr uint64_t kMaxLagMs = RetryBudget::kMaxClockSkewMs / 2;

uint64_t EnvNumber(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v, &end, 0);
  return end != nullptr && *end == '\0' ? n : fallback;
}

struct Shape {
  const char* name;
  uint64_t seed;
  uint64_t start_ms;  // the virtual clock's first reading
  Policy policy;
  bool shadow_heavy = false;  // shadow mode most of the time
};

std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << s.name; }

std::vector<Shape> Shapes() {
  std::vector<Shape> shapes;
  {
    Policy p;  // one probe, no bulkhead, no slow calls; the clock starts before 2^31 ms
    p.window_ms = 2'000;
    p.window_buckets = 10;
    p.min_calls = 8;
    p.open_for_ms = 200;
    p.open_for_max_ms = 3'000;
    p.open_jitter_ms = 100;
    p.probe_timeout_ms = 300;
    p.close_after = 2;
    shapes.push_back({"OneProbeNoBulkhead", 0x5EED0001, (kWrapMs >> 1) - 5'000, p});
  }
  {
    Policy p;  // three probes, a small bulkhead, slow calls; starts before 2^32 ms
    p.window_ms = 1'000;
    p.window_buckets = 4;
    p.min_calls = 5;
    p.slow_call_ms = 50;
    p.slow_call_rate_pct = 60;
    p.open_for_ms = 100;
    p.open_for_max_ms = 2'000;
    p.open_jitter_ms = 50;
    p.half_open_probes = 3;
    p.probe_timeout_ms = 200;
    p.close_after = 3;
    p.bulkhead_limit = 4;
    p.bulkhead_timeout_ms = 400;
    p.retry_ratio_milli = 300;
    p.min_retries_per_sec = 5;
    p.retry_burst = 4;
    shapes.push_back({"ThreeProbesBulkheadSlow", 0x5EED0002, kWrapMs - 3'000, p});
  }
  {
    Policy p;  // short buckets, tight limits, no jitter; starts before 2^33 ms
    p.window_ms = 300;
    p.window_buckets = 3;
    p.min_calls = 3;
    p.failure_rate_pct = 40;
    p.open_for_ms = 50;
    p.open_for_max_ms = 400;
    p.open_jitter_ms = 0;
    p.half_open_probes = 2;
    p.probe_timeout_ms = 80;
    p.close_after = 1;
    p.bulkhead_limit = 2;
    p.bulkhead_timeout_ms = 150;
    p.retry_ratio_milli = 100;
    p.min_retries_per_sec = 2;
    p.retry_burst = 2;
    shapes.push_back({"TwoProbesTightBulkhead", 0x5EED0003, 2 * kWrapMs - 1'000, p});
  }
  {
    Policy p;  // the built-in defaults; starts at 3 x 2^32 ms
    shapes.push_back({"Defaults", 0x5EED0004, 3 * kWrapMs, p});
  }
  {
    Policy p;  // buckets that are not whole milliseconds; a clock of 35 years
    p.window_ms = 1'000;
    p.window_buckets = 7;
    p.min_calls = 6;
    p.slow_call_ms = 20;
    p.slow_call_rate_pct = 50;
    p.failure_rate_pct = 60;
    p.open_for_ms = 150;
    p.open_for_max_ms = 1'200;
    p.open_jitter_ms = 333;
    p.half_open_probes = 3;
    p.probe_timeout_ms = 100;
    p.close_after = 2;
    p.bulkhead_limit = 3;
    p.bulkhead_timeout_ms = 250;
    shapes.push_back({"OddBuckets", 0x5EED0005, (uint64_t{1} << 40) + 12'345, p});
  }
  {
    Policy p = shapes[1].policy;  // shadow mode most of the time
    p.mode = Mode::kShadow;
    shapes.push_back({"MostlyShadow", 0x5EED0006, kWrapMs - 20'000, p, true});
  }
  return shapes;
}

// One operation, kept for the report of a failure.
struct Op {
  uint64_t step;
  uint64_t now_ms;
  std::string what;
};

class ModelRun {
 public:
  static constexpr uint32_t kVirtualCpus = 4;

  ModelRun(const Shape& shape, uint64_t seed)
      : shape_(shape),
        seed_(seed),
        rng_(seed),
        now_ms_(shape.start_ms),
        latest_ms_(shape.start_ms),
        model_(shape.policy, shape.start_ms) {
    // Four virtual CPUs' stripes (stripes.h): every thread moves among them and the shared
    // words, so the stripes' folds face the model at every step.
    seg_ = Segment::CreatePrivate(1, 64, shape.policy, testing::StripesFor(kVirtualCpus));
    index_ = testing::AddDependency(*seg_, "model", shape.policy);
    slot_ = seg_->dependency(index_);
    shm::Reset(*slot_, now_ns());  // the model starts as a slot just reset
    policy_ = shape.policy;
    for (uint16_t owner = 1; owner <= 4; ++owner) Spawn(owner);
    daemon_.caller = {kUnknownOwner, 0, 0xDAE30001};
    daemon_.model = {kUnknownOwner, 0xDAE30001};
    ResetBudgetBound();
  }

  // Run runs `steps` steps; false at the first disagreement (reported with ADD_FAILURE).
  bool Run(uint64_t steps) {
    for (step_ = 0; step_ < steps; ++step_) {
      Step();
      if (failed_ || !Check()) return false;
    }
    return true;
  }

 private:
  struct Held {
    Permit real;
    ModelPermit model;
  };
  struct Thread {
    Caller caller;
    ModelThread model;
    std::vector<Held> held;
  };
  struct Process {
    uint16_t owner;
    bool alive = true;
    std::vector<Thread> threads;
  };

  uint64_t now_ns() const { return now_ms_ * kNsPerMs; }
  uint64_t Below(uint64_t n) { return n == 0 ? 0 : rng_() % n; }
  bool Chance(uint64_t per_mille) { return Below(1000) < per_mille; }

  void Log(std::string what) {
    if (ops_.size() == 400) ops_.pop_front();
    ops_.push_back({step_, now_ms_, std::move(what)});
  }

  bool Fail(const std::string& what) {
    std::ostringstream os;
    os << "shape " << shape_.name << " seed " << seed_ << " step " << step_ << " (clock "
       << now_ms_ << " ms): " << what << "\nwindow " << policy_.window_ms << " ms in "
       << policy_.window_buckets << " buckets\nlast operations:\n";
    {  // the real slot's breaker and window words
      const BreakerWord bw = BreakerWord::Decode(slot_->breaker.load());
      os << "breaker seq " << bw.seq << " time " << bw.time_ms << " state " << int(bw.state)
         << " breaker_time seq " << BreakerTime::Seq(slot_->breaker_time.load()) << " ms "
         << BreakerTime::Ms(slot_->breaker_time.load()) << " head start "
         << WindowHead::StartMs(slot_->window_head.load()) << " bits "
         << WindowHead::Bits(slot_->window_head.load()) << "\n";
      for (int i = 0; i < 16; ++i) {
        const uint64_t w = slot_->buckets[i].load();
        os << " b" << i << " p" << Bucket::Period(w) << " c" << Bucket::Calls(w) << "\n";
      }
      for (uint32_t i = 0; i < kVirtualCpus; ++i) {
        const uint64_t w = testing::StripeOfCpu(*slot_, i).window.load();
        os << " stripe " << i << " end " << StripeWindow::EndMs(w, now_ms_) << " start "
           << testing::StripeOfCpu(*slot_, i).window_start.load() << " successes " << StripeWindow::Count(w)
           << "\n";
      }
    }
    for (const Op& op : ops_) os << "  step " << op.step << " @" << op.now_ms << ": " << op.what << "\n";
    ADD_FAILURE() << os.str();
    failed_ = true;
    return false;
  }

  // --- Virtual processes ---------------------------------------------------------------

  void Spawn(uint16_t owner) {
    Process p{owner, true, {}};
    const uint64_t threads = 1 + Below(3);
    for (uint64_t t = 0; t < threads; ++t) {
      const uint32_t seed = uint32_t(rng_()) | 1;
      Thread th;
      th.caller = {owner, uint16_t(rng_()), seed};
      th.model = {owner, seed};
      p.threads.push_back(std::move(th));
    }
    processes_.push_back(std::move(p));
  }

  // RandomLiveThread picks a live thread and the virtual CPU it runs on for its next call: one
  // of the stripes, or none (the shared words, as a thread without rseq writes).
  Thread* RandomLiveThread() {
    std::vector<Thread*> live;
    for (Process& p : processes_) {
      if (!p.alive) continue;
      for (Thread& t : p.threads) live.push_back(&t);
    }
    if (live.empty()) return nullptr;
    Thread* t = live[Below(live.size())];
    const uint64_t cpu = Below(kVirtualCpus + 1);
    testing::OnCpu(t->caller, cpu == kVirtualCpus ? kNoStripe : uint16_t(cpu));
    t->caller.stripe_mode = StripeMode::kAtomic;
    return t;
  }

  // --- Operations ----------------------------------------------------------------------

  void Step() {
    const uint64_t r = Below(1000);
    if (r < 420) return AdmitOne();
    if (r < 720) return CompleteOne();
    if (r < 880) return Advance(Chance(900) ? Below(20) : Below(400));
    if (r < 900) return Advance(Below(5'000));
    if (r < 915) return LaggedOp();
    if (r < 930) return DaemonSweep();
    if (r < 936) return Kill();
    if (r < 941) return Reap();
    if (r < 946) return SpawnOne();
    if (r < 952) return ChangeMode();
    if (r < 958) return StorePolicyOnce();
    if (r < 960) return ResetOnce();
    if (r < 961) return LongGap();
    return AdmitOne();
  }

  void AdmitOne() {
    Thread* t = RandomLiveThread();
    if (t == nullptr) return SpawnOne();
    if (t->held.size() >= 6) return CompleteFrom(*t);
    const uint32_t attempt = Chance(700) ? 0 : uint32_t(1 + Below(3));
    // Now and then a call short of the time a probe needs (AdmitNoProbe).
    const bool may_probe = !Chance(100);
    Held h;
    const Decision real = Admit(*slot_, index_, attempt, now_ns(), t->caller, &h.real, may_probe);
    const Decision want = model_.Admit(attempt, now_ms_, t->model, &h.model, may_probe);
    Log("admit owner " + std::to_string(t->caller.owner) + " attempt " + std::to_string(attempt) +
        (may_probe ? "" : " (no probe)") + ": " + DecisionName(real));
    if (real != want) {
      Fail(std::string("decision ") + DecisionName(real) + ", model " + DecisionName(want));
      return;
    }
    if (real == Decision::kAdmittedProbe && h.real.probe_index != h.model.probe_index) {
      Fail("probe word " + std::to_string(h.real.probe_index) + ", model " +
           std::to_string(h.model.probe_index));
      return;
    }
    if (IsAdmitted(real)) {
      t->held.push_back(h);
    } else {
      // A rejected permit completes as a no-op.
      Complete(*slot_, &h.real, Outcome::kSuccess, 0, now_ns(), t->caller);
      model_.Complete(&h.model, Outcome::kSuccess, 0, now_ms_, t->model);
    }
  }

  void CompleteOne() {
    Thread* t = RandomLiveThread();
    if (t == nullptr || t->held.empty()) return AdmitOne();
    CompleteFrom(*t);
  }

  void CompleteFrom(Thread& t) {
    const size_t i = Below(t.held.size());
    Held h = t.held[i];
    t.held.erase(t.held.begin() + i);
    const uint64_t o = Below(100);
    const Outcome outcome = o < 60 ? Outcome::kSuccess : o < 88 ? Outcome::kFailure : Outcome::kIgnored;
    const uint64_t slow_ms = policy_.slow_call_ms != 0 ? policy_.slow_call_ms : 100;
    const uint64_t latency_ns =
        Chance(250) ? Below(2 * slow_ms * kNsPerMs + 1) : Below(10 * kNsPerMs);
    const int times = Chance(20) ? 2 : 1;  // a second Complete is a no-op
    for (int n = 0; n < times; ++n) {
      Complete(*slot_, &h.real, outcome, latency_ns, now_ns(), t.caller);
      model_.Complete(&h.model, outcome, latency_ns, now_ms_, t.model);
    }
    Log("complete owner " + std::to_string(t.caller.owner) + " " +
        (outcome == Outcome::kSuccess   ? "success"
         : outcome == Outcome::kFailure ? "failure"
                                        : "ignored") +
        " latency " + std::to_string(latency_ns / 1000) + "us" +
        (h.real.flags & kPermitProbe ? " probe" : "") + (times == 2 ? " twice" : ""));
  }

  void Advance(uint64_t ms) {
    now_ms_ += ms;
    if (now_ms_ > latest_ms_) {
      budget_d_ -= int64_t(policy_.min_retries_per_sec) * int64_t(now_ms_ - latest_ms_);
      latest_ms_ = now_ms_;
    }
    if (ms > 1'000) Log("advance " + std::to_string(ms) + " ms");
  }

  // One admit or completion whose clock read lags the latest read by up to kMaxLagMs: a
  // process that read the clock and was descheduled before it used the time.
  void LaggedOp() {
    uint64_t lag = Chance(800) ? Below(20) : Below(kMaxLagMs + 1);
    const model::ModelBreaker& b = model_.breaker();
    // A probe success that closes with a read lagging the newest bucket period by a window
    // restarts the window in a bucket that holds a newer period: keep its lag under a bucket.
    if (b.state == BreakerState::kHalfOpen) {
      lag = std::min<uint64_t>(lag, policy_.window_ms / policy_.window_buckets / 2);
    }
    now_ms_ = latest_ms_ - lag;
    Log("clock read " + std::to_string(lag) + " ms behind the latest");
    const uint32_t stamp = RetryBudget::StampMs(slot_->budget.load());
    const uint64_t granted = ReadCounter(*slot_, kRetriesGranted);
    Chance(500) ? AdmitOne() : CompleteOne();
    // A lagging withdrawal bends the bound by up to the floor over its lag: one that moves the
    // stamp to its read has the floor from there credited again by a later read, and one
    // behind the stamp takes a token from the count before the floor since the stamp is added
    // and capped, so up to a token of that floor escapes the cap.
    const uint32_t moved = RetryBudget::StampMs(slot_->budget.load());
    const int64_t floor = policy_.min_retries_per_sec;
    if (moved != stamp) {
      budget_d_ -= floor * int64_t(uint32_t(latest_ms_) - moved);
    } else if (ReadCounter(*slot_, kRetriesGranted) != granted) {
      budget_d_ -= std::min<int64_t>(1000, floor * int64_t(uint32_t(latest_ms_) - stamp));
    }
    now_ms_ = latest_ms_;
  }

  // A long idle gap: minutes to a year, or onto a 2^32 ms wrap of a stored stamp.
  void LongGap() {
    uint64_t target;
    // Gaps of days and more stop at kClockCeilingMs: a clock in nanoseconds lasts 584 years.
    const uint64_t kind = latest_ms_ < kClockCeilingMs ? Below(10) : 0;
    if (kind <= 3) {
      target = latest_ms_ + 60'000 + Below(3'600'000);
    } else if (kind <= 6) {
      target = latest_ms_ + Below(60 * kDayMs);
    } else if (kind == 7) {
      target = latest_ms_ + 60 * kDayMs + Below(305 * kDayMs);
    } else {
      // k x 2^32 ms after the budget's stamp or the breaker's time, give or take a bit more
      // than the skew and the deadline window.
      const uint64_t base = kind == 8 ? model_.budget_stamp_ms() : model_.breaker().time_ms;
      const uint64_t k = 1 + Below(3);
      const uint64_t spread = Chance(500) ? 2 * RetryBudget::kMaxClockSkewMs : 3 * kDayMs;
      target = base + k * kWrapMs + Below(2 * spread) - spread;
    }
    if (target <= latest_ms_) target = latest_ms_ + 1;
    const uint64_t gap = target - now_ms_;
    Advance(gap);
    Log("long gap of " + std::to_string(gap) + " ms");
  }

  void DaemonSweep() {
    const Sweep sweep = Chance(200) ? Sweep::kAllWords : Sweep::kLimits;
    const uint32_t real = ReclaimExpired(*slot_, now_ns(), daemon_.caller, sweep);
    const uint32_t want = model_.ReclaimExpired(now_ms_, daemon_.model);
    Log("daemon sweep freed " + std::to_string(real));
    if (real != want) Fail("sweep freed " + std::to_string(real) + ", model " + std::to_string(want));
  }

  // A process dies: its permits are abandoned, its leases stay until reaped or expired.
  void Kill() {
    std::vector<Process*> live;
    for (Process& p : processes_) {
      if (p.alive) live.push_back(&p);
    }
    if (live.size() <= 1) return;
    Process& p = *live[Below(live.size())];
    p.alive = false;
    Log("kill owner " + std::to_string(p.owner));
  }

  // The daemon learns that a process died and frees its leases.
  void Reap() {
    for (size_t i = 0; i < processes_.size(); ++i) {
      if (processes_[i].alive) continue;
      const uint16_t owner = processes_[i].owner;
      const uint64_t owner_word = seg_->process(owner - 1u)->owner.load();
      const uint64_t real = ReclaimOwner(*seg_, owner, owner_word);
      const uint64_t want = model_.ReclaimOwner(owner);
      processes_.erase(processes_.begin() + i);
      Log("reap owner " + std::to_string(owner) + ": " + std::to_string(real) + " leases");
      if (real != want) Fail("reaped " + std::to_string(real) + " leases, model " + std::to_string(want));
      return;
    }
  }

  // A new process takes an owner id that no process, live or unreaped, holds.
  void SpawnOne() {
    if (processes_.size() >= 8) return;
    for (int tries = 0; tries < 16; ++tries) {
      const uint16_t owner = uint16_t(1 + Below(12));
      const bool taken = std::any_of(processes_.begin(), processes_.end(),
                                     [&](const Process& p) { return p.owner == owner; });
      if (taken) continue;
      Spawn(owner);
      Log("spawn owner " + std::to_string(owner));
      return;
    }
  }

  void ChangeMode() {
    const uint64_t r = Below(100);
    Mode mode = r < 55 ? Mode::kEnforce : r < 70 ? Mode::kDisabled : r < 85 ? Mode::kForcedOpen : Mode::kShadow;
    if (shape_.shadow_heavy && r < 55) mode = Mode::kShadow;
    slot_->mode.store(uint32_t(mode));
    model_.SetMode(mode);
    Log(std::string("mode ") + ModeName(mode));
  }

  // A reload: the soft knobs move around the shape's values, and so does the window's shape
  // (which starts the window anew, with the stripes holding periods of the old one); the probe
  // count and the bulkhead limit stay.
  void StorePolicyOnce() {
    const Policy& base = shape_.policy;
    Policy p = policy_;
    auto around = [&](uint32_t v, uint32_t lo, uint32_t hi) {
      const uint64_t scaled = uint64_t{v} * (1 + Below(4)) / 2;  // x0.5 .. x2
      return uint32_t(std::clamp<uint64_t>(scaled, lo, hi));
    };
    switch (Below(9)) {
      case 0: p.failure_rate_pct = around(base.failure_rate_pct, 1, 100); break;
      case 1: p.min_calls = around(std::max<uint32_t>(base.min_calls, 1), 0, 1'000); break;
      case 2:
        p.open_for_ms = around(base.open_for_ms, 1, 86'400'000);
        p.open_for_max_ms = std::max(p.open_for_ms, around(base.open_for_max_ms, 1, 86'400'000));
        p.open_jitter_ms = around(base.open_jitter_ms, 0, 86'400'000);
        break;
      case 3: p.close_after = around(base.close_after, 1, 255); break;
      case 4: p.probe_timeout_ms = around(base.probe_timeout_ms, 1, 86'400'000); break;
      case 5: p.bulkhead_timeout_ms = around(base.bulkhead_timeout_ms, 1, 86'400'000); break;
      case 6:
        p.retry_ratio_milli = around(std::max<uint32_t>(base.retry_ratio_milli, 1), 0, 100'000);
        p.min_retries_per_sec = around(base.min_retries_per_sec, 0, 1'000'000);
        p.retry_burst = around(base.retry_burst, 1, 1'000'000);
        break;
      case 8: {
        p.window_ms = around(base.window_ms, 100, 3'600'000);
        const uint32_t most = std::min<uint32_t>(kMaxBuckets, p.window_ms / 50);
        p.window_buckets = 1 + uint32_t(Below(most));
        break;
      }
      case 7:
        if (base.slow_call_ms != 0) {
          p.slow_call_ms = around(base.slow_call_ms, 1, 86'400'000);
          p.slow_call_rate_pct = around(base.slow_call_rate_pct, 1, 100);
        }
        break;
    }
    if (!Validate(p).ok()) {
      Fail("the test built an invalid policy: " + Validate(p).message);
      return;
    }
    p.mode = Mode(slot_->mode.load());
    // As the daemon's reload does (PutDependency): the stripes' deposits fold under the old
    // cap, which keeps none of the overshoot past it that the model's single deposits leave.
    FoldDeposits(*slot_);
    const uint64_t old_cap = uint64_t{policy_.retry_burst} * RetryBudget::kTokenScale;
    const uint64_t word = RetryBudget::Tokens(slot_->budget.load());
    if (model_.budget_tokens_milli() > old_cap && word < model_.budget_tokens_milli()) {
      if (word < old_cap || model_.budget_tokens_milli() - word >= policy_.retry_ratio_milli) {
        Fail("a reload's fold left " + std::to_string(word) + " thousandths, the model " +
             std::to_string(model_.budget_tokens_milli()) + ": more than its overshoot");
        return;
      }
      model_.set_budget_tokens_milli(word);
    }
    StorePolicyOf(*slot_, p);  // as the daemon's reload stores it
    model_.SetPolicy(p);
    policy_ = p;
    ResetBudgetBound();
    Log("store policy: window " + std::to_string(p.window_ms) + " ms in " +
        std::to_string(p.window_buckets) + " buckets");
  }

  void ResetOnce() {
    shm::Reset(*slot_, now_ns());
    model_.Reset(now_ms_);
    ResetBudgetBound();
    Log("reset");
  }

  // --- The budget's bound over any interval ---------------------------------------------
  // With D(t) = 1000 x granted - ratio x first attempts - floor x elapsed ms (all up to t, in
  // thousandths of a token), the bound holds over every interval [s, t] iff
  // D(t) - min over s <= t of D(s) <= 1000 x burst. An operator's reset refills the budget and a
  // reload changes the terms, so the intervals start again there.

  void ResetBudgetBound() {
    seen_granted_ = ReadCounter(*slot_, kRetriesGranted);
    seen_first_ = ReadCounter(*slot_, kFirstAttempts);
    budget_d_ = 0;
    budget_min_d_ = 0;
  }

  bool CheckBudgetBound() {
    const uint64_t granted = ReadCounter(*slot_, kRetriesGranted);
    const uint64_t first = ReadCounter(*slot_, kFirstAttempts);
    budget_d_ += int64_t(granted - seen_granted_) * 1000 -
                 int64_t(first - seen_first_) * int64_t(policy_.retry_ratio_milli);
    seen_granted_ = granted;
    seen_first_ = first;
    budget_min_d_ = std::min(budget_min_d_, budget_d_);
    if (budget_d_ - budget_min_d_ > int64_t(policy_.retry_burst) * 1000) {
      return Fail("retries granted exceed burst + ratio x first attempts + floor x seconds by " +
                  std::to_string(budget_d_ - budget_min_d_ - int64_t(policy_.retry_burst) * 1000) +
                  " thousandths");
    }
    return true;
  }

  // --- Comparison and invariants --------------------------------------------------------

  bool Check() {
    for (const CounterInfo& c : kCounterInfo) {
      const uint64_t real = ReadCounter(*slot_, c.counter);
      if (real != model_.counter(c.counter)) {
        return Fail(std::string("counter ") + c.name + " " + std::to_string(real) + ", model " +
                    std::to_string(model_.counter(c.counter)));
      }
    }
    const BreakerWord b = BreakerWord::Decode(slot_->breaker.load());
    const model::ModelBreaker& mb = model_.breaker();
    if (b.state != mb.state || b.reopens != mb.reopens || b.successes != mb.successes ||
        b.seq != mb.seq || b.time_ms != uint32_t(mb.time_ms)) {
      return Fail(std::string("breaker ") + BreakerStateName(b.state) + " reopens " +
                  std::to_string(b.reopens) + " successes " + std::to_string(b.successes) +
                  " seq " + std::to_string(b.seq) + " time " + std::to_string(b.time_ms) +
                  ", model " + BreakerStateName(mb.state) + " reopens " +
                  std::to_string(mb.reopens) + " successes " + std::to_string(mb.successes) +
                  " seq " + std::to_string(mb.seq) + " time " +
                  std::to_string(uint32_t(mb.time_ms)));
    }
    const WindowStats w = ReadWindow(*slot_, now_ns());
    const model::ModelWindowStats mw = model_.Window(now_ms_);
    if (w.calls != mw.calls || w.failures != mw.failures || w.slow != mw.slow) {
      return Fail("window calls/failures/slow " + std::to_string(w.calls) + "/" +
                  std::to_string(w.failures) + "/" + std::to_string(w.slow) + ", model " +
                  std::to_string(mw.calls) + "/" + std::to_string(mw.failures) + "/" +
                  std::to_string(mw.slow));
    }
    // The budget as the next withdrawal finds it: the word plus the deposits waiting in the
    // stripes, capped (stripes.h); the model keeps every deposit in its one count.
    const uint64_t budget = slot_->budget.load();
    const uint64_t cap = uint64_t{policy_.retry_burst} * RetryBudget::kTokenScale;
    const uint64_t tokens = std::min(cap, RetryBudget::Tokens(budget) + PendingDeposits(*slot_));
    if (tokens != std::min(cap, model_.budget_tokens_milli()) ||
        RetryBudget::StampMs(budget) != uint32_t(model_.budget_stamp_ms())) {
      return Fail("budget tokens " + std::to_string(tokens) + " (word " +
                  std::to_string(RetryBudget::Tokens(budget)) + ", waiting in stripes " +
                  std::to_string(PendingDeposits(*slot_)) + ") stamp " +
                  std::to_string(RetryBudget::StampMs(budget)) + ", model " +
                  std::to_string(model_.budget_tokens_milli()) + " stamp " +
                  std::to_string(uint32_t(model_.budget_stamp_ms())));
    }
    const uint64_t available = RetryBudget::Available(budget, uint32_t(now_ms_),
                                                      policy_.min_retries_per_sec, policy_.retry_burst);
    if (available > uint64_t{policy_.retry_burst} * RetryBudget::kTokenScale) {
      return Fail("the budget holds " + std::to_string(available) + " thousandths, over its burst");
    }
    if (!CheckBudgetBound()) return false;
    return CheckLeases(b);
  }

  bool CheckLeases(const BreakerWord& b) {
    uint32_t current_probes = 0;
    for (uint32_t i = 0; i < kMaxProbes; ++i) {
      const uint64_t w = slot_->probe_leases[i].load();
      const model::ModelLease& m = model_.probe_word(i);
      if ((w != 0) != (m.serial != 0) ||
          (w != 0 && (Lease::Owner(w) != m.owner || Lease::Tag(w) != m.tag ||
                      Lease::ExpiryMs(w) != uint32_t(m.expiry_ms)))) {
        return Fail("probe word " + std::to_string(i) + " holds owner " +
                    std::to_string(Lease::Owner(w)) + " tag " + std::to_string(Lease::Tag(w)) +
                    " expiry " + std::to_string(Lease::ExpiryMs(w)) + ", model " +
                    (m.serial == 0 ? std::string("free")
                                   : "owner " + std::to_string(m.owner) + " tag " +
                                         std::to_string(m.tag) + " expiry " +
                                         std::to_string(uint32_t(m.expiry_ms))));
      }
      current_probes += w != 0 && b.state == BreakerState::kHalfOpen && Lease::Tag(w) == b.seq;
    }
    if (current_probes > policy_.half_open_probes ||
        model_.CurrentProbesInFlight() != current_probes) {
      return Fail(std::to_string(current_probes) + " probes in flight in half-open " +
                  std::to_string(b.seq) + ", limit " + std::to_string(policy_.half_open_probes));
    }
    std::vector<std::pair<uint16_t, uint32_t>> real, want;
    for (uint32_t i = 0; i < kMaxBulkhead; ++i) {
      const uint64_t w = slot_->bulkhead_leases[i].load();
      if (w == 0) continue;
      if (i >= policy_.bulkhead_limit) {
        return Fail("bulkhead word " + std::to_string(i) + " taken, limit " +
                    std::to_string(policy_.bulkhead_limit));
      }
      real.emplace_back(Lease::Owner(w), Lease::ExpiryMs(w));
    }
    for (const model::ModelLease& l : model_.bulkhead_leases()) {
      want.emplace_back(l.owner == 0 ? 1 : l.owner, uint32_t(l.expiry_ms));
    }
    std::sort(real.begin(), real.end());
    std::sort(want.begin(), want.end());
    if (real.size() > policy_.bulkhead_limit || real != want) {
      return Fail(std::to_string(real.size()) + " bulkhead leases taken, model " +
                  std::to_string(want.size()) + ", limit " +
                  std::to_string(policy_.bulkhead_limit));
    }
    return true;
  }

  const Shape shape_;
  const uint64_t seed_;
  std::mt19937_64 rng_;
  uint64_t now_ms_;
  uint64_t latest_ms_;  // the latest time any process read
  uint64_t step_ = 0;
  bool failed_ = false;
  std::deque<Op> ops_;

  std::unique_ptr<Segment> seg_;
  uint32_t index_ = 0;
  DependencySlot* slot_ = nullptr;
  Policy policy_;
  DependencyModel model_;
  std::vector<Process> processes_;
  struct {
    Caller caller;
    ModelThread model;
  } daemon_;

  uint64_t seen_granted_ = 0;
  uint64_t seen_first_ = 0;
  int64_t budget_d_ = 0;
  int64_t budget_min_d_ = 0;
};

// --- Disagreements found by the model, one invariant each ---------------------------------

// After an operator's reset, every call of a closed breaker counts in its window, the calls in
// the reset's own bucket period included (breaker.h: a window that spans the last close ignores
// only the buckets before it).
TEST(ModelRegressionTest, ResetWindowCountsTheCallsOfItsBucketPeriod) {
  Policy p;
  p.window_ms = 10'000;
  p.window_buckets = 10;  // 1 s buckets
  p.min_calls = 3;
  p.failure_rate_pct = 50;
  std::unique_ptr<Segment> seg = Segment::CreatePrivate(1, 4, p);
  DependencySlot& slot = *seg->dependency(testing::AddDependency(*seg, "orders", p));
  // A bucket period whose 16-bit number is at least 0x8000 (here 0x9000).
  const uint64_t now = (uint64_t{7} * 65'536 + 0x9000) * testing::kSec;
  Caller caller{1, 0, 12345};
  Reset(slot, now - 20 * testing::kSec);
  auto call = [&](Outcome outcome) {
    Permit permit;
    ASSERT_TRUE(IsAdmitted(Admit(slot, 0, 0, now, caller, &permit)));
    Complete(slot, &permit, outcome, testing::kMs, now, caller);
  };
  call(Outcome::kSuccess);  // the period's first call, before the reset
  Reset(slot, now);
  for (int i = 0; i < 3; ++i) call(Outcome::kFailure);
  EXPECT_EQ(ReadWindow(slot, now).calls, 3u);
  EXPECT_EQ(BreakerWord::Decode(slot.breaker.load()).state, BreakerState::kOpen);
}

// A breaker that closed less than a window ago counts only the calls since, whichever clock
// read reports the next call: one that lags the close by a few milliseconds (a process that
// read the clock just before another's probe closed the breaker) included.
TEST(ModelRegressionTest, LaggingReadAfterACloseIgnoresTheCallsBeforeIt) {
  Policy p;
  p.window_ms = 10'000;
  p.window_buckets = 10;
  p.min_calls = 3;
  p.failure_rate_pct = 50;
  p.open_for_ms = 1'000;
  p.open_jitter_ms = 0;
  p.close_after = 1;
  std::unique_ptr<Segment> seg = Segment::CreatePrivate(1, 4, p);
  DependencySlot& slot = *seg->dependency(testing::AddDependency(*seg, "orders", p));
  const uint64_t t0 = 5'000 * testing::kSec;
  Caller caller{1, 0, 12345};
  Reset(slot, t0 - 20 * testing::kSec);
  auto call = [&](uint64_t admit_ns, uint64_t complete_ns, Outcome outcome) {
    Permit permit;
    ASSERT_TRUE(IsAdmitted(Admit(slot, 0, 0, admit_ns, caller, &permit)));
    Complete(slot, &permit, outcome, testing::kMs, complete_ns, caller);
  };
  for (int i = 0; i < 3; ++i) call(t0, t0, Outcome::kFailure);
  ASSERT_EQ(BreakerWord::Decode(slot.breaker.load()).state, BreakerState::kOpen);
  const uint64_t closed = t0 + 1'000 * testing::kMs;
  call(closed, closed, Outcome::kSuccess);  // the probe closes the breaker
  ASSERT_EQ(BreakerWord::Decode(slot.breaker.load()).state, BreakerState::kClosed);
  // One failure since the close, reported with a clock read 5 ms before it.
  call(closed, closed - 5 * testing::kMs, Outcome::kFailure);
  // The window ignores the buckets before the close's, at bucket granularity: this read falls in
  // the bucket before it, so the window holds nothing, and certainly not the three old failures.
  EXPECT_EQ(ReadWindow(slot, closed - 5 * testing::kMs).calls, 0u);
  EXPECT_EQ(ReadWindow(slot, closed).calls, 0u);
  EXPECT_EQ(BreakerWord::Decode(slot.breaker.load()).state, BreakerState::kClosed);
}

// A breaker closed for 2^32 ms (49.7 days) has not just closed: its window counts every call
// in it, those before the instant the 32-bit close time comes round again included.
TEST(ModelRegressionTest, WindowOfALongClosedBreakerCountsEveryCallInIt) {
  Policy p;
  p.window_ms = 10'000;
  p.window_buckets = 10;
  p.min_calls = 3;
  p.failure_rate_pct = 50;
  std::unique_ptr<Segment> seg = Segment::CreatePrivate(1, 4, p);
  DependencySlot& slot = *seg->dependency(testing::AddDependency(*seg, "orders", p));
  const uint64_t closed = 5'000 * testing::kSec;
  Caller caller{1, 0, 12345};
  Reset(slot, closed);
  auto call = [&](uint64_t now, Outcome outcome) {
    Permit permit;
    ASSERT_TRUE(IsAdmitted(Admit(slot, 0, 0, now, caller, &permit)));
    Complete(slot, &permit, outcome, testing::kMs, now, caller);
  };
  const uint64_t wrap = (uint64_t{1} << 32) * testing::kMs;
  call(closed + wrap - 500 * testing::kMs, Outcome::kFailure);
  call(closed + wrap - 400 * testing::kMs, Outcome::kFailure);
  call(closed + wrap + 100 * testing::kMs, Outcome::kFailure);
  EXPECT_EQ(ReadWindow(slot, closed + wrap + 100 * testing::kMs).calls, 3u);
  EXPECT_EQ(BreakerWord::Decode(slot.breaker.load()).state, BreakerState::kOpen);
}

class ModelTest : public ::testing::TestWithParam<Shape> {};

TEST_P(ModelTest, RealSlotMatchesTheModelAtEveryStep) {
  const Shape& shape = GetParam();
  const uint64_t steps =
      EnvNumber("RETRYD_MODEL_STEPS", kSanitized ? kDefaultSteps / 10 : kDefaultSteps);
  const uint64_t seed = EnvNumber("RETRYD_MODEL_SEED", shape.seed);
  SCOPED_TRACE("shape " + std::string(shape.name) + " seed " + std::to_string(seed));
  ModelRun run(shape, seed);
  EXPECT_TRUE(run.Run(steps));
}

INSTANTIATE_TEST_SUITE_P(Shapes, ModelTest, ::testing::ValuesIn(Shapes()),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace retryd::shm
