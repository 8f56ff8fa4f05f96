// tick_fuzzer: the daemon's housekeeping over a segment whose client-writable words hold
// whatever a buggy or hostile client wrote. A client with write access can scribble on every
// word of every dependency slot (breaker, budget, buckets, counters, leases, policy, name,
// mode, state) and of every process slot, and on the header's shared words. Whatever it
// writes, the daemon's tick, reload and metrics, and the hot path of the other clients, must
// neither crash, read out of bounds, trip a sanitizer, nor loop forever.
//
// One real daemon::Daemon runs on a small named segment (4 dependencies, 8 process slots).
// Each input restores the segment to its state after start, starts a fresh Daemon on it (so
// that a crash reproduces from its input alone), and plays the input as a program of
// 11-byte steps: [op][10 bytes of operands]. Ops: scribble a word, Admit, Complete, expire
// leases, reap dead owners (pidfds), reclaim dead processes with a fake liveness test, read the
// window, render metrics, tick the daemon, reload it, advance time, reset a breaker.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <glog/logging.h>

#include "daemon/daemon.h"
#include "daemon/metrics.h"
#include "fuzz/fuzz_util.h"
#include "shm/admission.h"
#include "shm/breaker.h"
#include "shm/clock.h"
#include "shm/registry.h"
#include "shm/segment.h"

namespace {

using namespace retryd;

struct Fixture {
  std::string segment_name;
  std::string config_path;
  std::string metrics_path;
  std::vector<uint8_t> snapshot;  // the segment right after the first start
};

Fixture* g_fixture = nullptr;

void Cleanup() {
  if (!g_fixture) return;
  shm::Segment::Remove(g_fixture->segment_name);
  unlink(g_fixture->config_path.c_str());
  unlink(g_fixture->metrics_path.c_str());
}

std::unique_ptr<daemon::Daemon> StartDaemon() {
  daemon::DaemonOptions opt;
  opt.config_path = g_fixture->config_path;
  opt.segment = g_fixture->segment_name;
  std::unique_ptr<daemon::Daemon> d;
  const Status s = daemon::Daemon::Start(opt, &d);
  if (!s.ok()) {
    std::fprintf(stderr, "tick_fuzzer: cannot start the daemon: %s\n", s.ToString().c_str());
    std::abort();
  }
  // Start blocks SIGHUP, SIGTERM and SIGINT for its signalfd; give Ctrl-C back to libFuzzer.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGHUP);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  return d;
}

// The segment as the daemon maps it: writable memory shared with the fuzzer's "clients".
uint64_t* Words(const daemon::Daemon& d) {
  return reinterpret_cast<uint64_t*>(const_cast<shm::SegmentHeader*>(&d.segment().header()));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  FLAGS_minloglevel = 3;  // the daemon's log lines are not what is tested here
  FLAGS_logtostderr = true;
  g_fixture = new Fixture;
  const std::string tag = std::to_string(getpid());
  g_fixture->segment_name = "retryd-fuzz-tick-" + tag;
  g_fixture->config_path = "/tmp/retryd-fuzz-tick-" + tag + ".toml";
  g_fixture->metrics_path = "/tmp/retryd-fuzz-tick-" + tag + ".prom";
  std::ofstream(g_fixture->config_path)
      << "[daemon]\nmax_dependencies = 4\nmax_processes = 8\ntick = \"10ms\"\n"
      << "metrics_textfile = \"" << g_fixture->metrics_path << "\"\n"
      << "metrics_interval = \"100ms\"\n"
      << "[defaults]\nmin_calls = 2\nopen_for = \"50ms\"\nprobe_timeout = \"100ms\"\n"
      << "[dependency.orders]\nbulkhead_limit = 4\nhalf_open_probes = 2\n"
      << "bulkhead_timeout = \"200ms\"\nslow_call_duration = \"5ms\"\n"
      << "[dependency.\"db.primary\"]\nretry_burst = 3\nclose_after = 1\n";
  shm::Segment::Remove(g_fixture->segment_name);
  std::atexit(Cleanup);
  std::unique_ptr<daemon::Daemon> d = StartDaemon();
  const auto* p = reinterpret_cast<const uint8_t*>(&d->segment().header());
  g_fixture->snapshot.assign(p, p + d->segment().size());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Restore the segment as the first daemon left it, then start this input's daemon on it.
  {
    std::unique_ptr<shm::Segment> seg;
    if (!shm::Segment::Attach(g_fixture->segment_name, shm::Access::kReadWrite, &seg).ok()) {
      // A previous input may have left a header that no longer validates: start clean.
      shm::Segment::Remove(g_fixture->segment_name);
      StartDaemon();
      if (Status s = shm::Segment::Attach(g_fixture->segment_name, shm::Access::kReadWrite, &seg);
          !s.ok()) {
        std::fprintf(stderr, "tick_fuzzer: cannot attach a fresh segment: %s\n",
                     s.ToString().c_str());
        std::abort();
      }
    }
    if (seg->size() != g_fixture->snapshot.size()) std::abort();
    std::memcpy(const_cast<shm::SegmentHeader*>(&seg->header()), g_fixture->snapshot.data(),
                g_fixture->snapshot.size());
  }
  std::unique_ptr<daemon::Daemon> d = StartDaemon();
  const shm::Segment& seg = d->segment();
  shm::Segment& mutable_seg = const_cast<shm::Segment&>(seg);
  uint64_t* words = Words(*d);
  const uint32_t word_count = uint32_t(seg.size() / 8);
  const uint32_t deps = seg.max_dependencies();

  uint64_t now_ns = shm::PreciseNowNs();
  shm::Permit permits[8] = {};
  shm::Caller caller{1, 0, 12345};
  shm::DeadOwnerReaper reaper;

  retryd::fuzz::FuzzInput in(data, size);
  for (int step = 0; step < 256 && in.remaining() > 0; ++step) {
    const uint8_t op = in.Take<uint8_t>();
    const uint16_t a = in.Take<uint16_t>();
    const uint64_t b = in.Take<uint64_t>();
    shm::DependencySlot& slot = *seg.dependency(a % deps);
    shm::Permit& permit = permits[(a >> 8) % 8];
    switch (op % 16) {
      case 0:
      case 1:
      case 2:
      case 3:  // a client scribbles one word anywhere in the segment
        words[a % word_count] = b;
        break;
      case 4: {  // a client's admit; the permit's indices must stay in range
        caller.owner = uint16_t(b >> 48);
        const shm::Decision dec = shm::Admit(slot, a % deps, uint32_t(b & 7), now_ns, caller, &permit);
        if (uint32_t(dec) > uint32_t(shm::Decision::kRejectedBudgetEmpty)) std::abort();
        if ((permit.flags & shm::kPermitProbe) && permit.probe_index >= shm::kMaxProbes) std::abort();
        if ((permit.flags & shm::kPermitBulkhead) && permit.bulkhead_index >= shm::kMaxBulkhead) {
          std::abort();
        }
        break;
      }
      case 5:  // a client completes (its permit may even be scribbled)
        if (b & 1) std::memcpy(&permit, &b, sizeof(b));
        shm::Complete(slot, &permit, shm::Outcome((b >> 8) % 4), b >> 16, now_ns, caller);
        break;
      case 6:
        shm::ReclaimExpired(slot, now_ns, caller, (b & 1) ? shm::Sweep::kAllWords : shm::Sweep::kLimits);
        break;
      case 7:
        reaper.Tick(mutable_seg);
        break;
      case 8:
        shm::ReclaimDeadProcesses(mutable_seg, [b](pid_t pid, uint64_t start) {
          return ((b >> (uint32_t(pid) % 64)) ^ start) & 1;
        });
        break;
      case 9: {
        const shm::WindowStats w = shm::ReadWindow(slot, now_ns);
        (void)shm::ShouldTrip(slot, w);
        (void)shm::OpenPeriodMs(slot.policy, uint32_t(b % 128), uint32_t(b >> 32));
        break;
      }
      case 10:
        (void)daemon::RenderPrometheus(seg, now_ns);
        break;
      case 11:
      case 12:  // the daemon ticks at the fuzzer's time
        d->Tick(now_ns);
        (void)d->StatusLine();
        break;
      case 13:
        // The create lock is client-writable too; a lock stamped in the future stalls each
        // creator for its 2 s give-up, which is a stall, not a crash: tested elsewhere.
        seg.header().create_lock.store(0);
        // Refused or applied, the daemon must go on ticking: either outcome is fine here.
        (void)d->Reload();
        break;
      case 14:  // time moves, forwards mostly, sometimes by a lot or backwards
        now_ns += (b & 0x8000'0000'0000'0000ull) ? uint64_t(-int64_t(b % 10'000'000'000ull))
                                                 : b % 100'000'000'000ull;
        break;
      case 15:
        if (b & 1) {
          shm::Reset(slot, now_ns);
        } else {
          (void)shm::LoadPolicy(slot.policy);
          (void)shm::ReadName(slot);
          (void)seg.Find("orders");
        }
        break;
    }
  }
  return 0;
}
