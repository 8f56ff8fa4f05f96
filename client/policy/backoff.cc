#include "retryd/backoff.h"

#include <pthread.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <utility>

namespace retryd {
namespace {

using std::chrono::nanoseconds;

// Bumped in every child process fork() creates; a thread whose generator was seeded under an
// older value reseeds, so forked workers never replay their parent's sequence.
std::atomic<uint64_t> fork_generation{1};

void OnForkChild() { fork_generation.fetch_add(1, std::memory_order_relaxed); }

uint64_t SplitMix64(uint64_t* x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15u);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
  return z ^ (z >> 31);
}

uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

// xoshiro256** (Blackman and Vigna): four words of state, sub-nanosecond per value.
struct Xoshiro {
  uint64_t s[4];
  uint64_t generation;  // fork_generation at seeding; 0 = never seeded
};

constinit thread_local Xoshiro tls_random = {{0, 0, 0, 0}, 0};

void Seed(Xoshiro* x, uint64_t generation) {
  uint64_t material[4] = {0, 0, 0, 0};
  // getrandom never blocks once the pool is initialized; a short read leaves zeros, which the
  // pid, thread and clock words below still make distinct per thread and process.
  ssize_t got = getrandom(material, sizeof(material), GRND_NONBLOCK);
  (void)got;
  uint64_t mix = material[0] ^ (uint64_t(getpid()) << 32) ^
                 uint64_t(reinterpret_cast<uintptr_t>(x)) ^
                 uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()) ^
                 (uint64_t(std::chrono::system_clock::now().time_since_epoch().count()) << 7);
  for (int i = 0; i < 4; ++i) x->s[i] = SplitMix64(&mix) ^ material[i];
  if ((x->s[0] | x->s[1] | x->s[2] | x->s[3]) == 0) x->s[0] = 1;  // the one forbidden state
  x->generation = generation;
}

constexpr int64_t kMaxNs = std::numeric_limits<int64_t>::max();

int64_t NonNegative(nanoseconds d) { return d.count() < 0 ? 0 : d.count(); }

int64_t SaturatingMul3(int64_t v) { return v > kMaxNs / 3 ? kMaxNs : v * 3; }

int64_t SaturatingAdd(int64_t a, int64_t b) { return a > kMaxNs - b ? kMaxNs : a + b; }

}  // namespace

uint64_t ThreadLocalRandom() {
  static const bool registered = (pthread_atfork(nullptr, nullptr, &OnForkChild), true);
  (void)registered;
  Xoshiro* x = &tls_random;
  uint64_t generation = fork_generation.load(std::memory_order_relaxed);
  if (x->generation != generation) Seed(x, generation);
  uint64_t* s = x->s;
  uint64_t result = Rotl(s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = Rotl(s[3], 45);
  return result;
}

nanoseconds UniformBetween(nanoseconds lo, nanoseconds hi, uint64_t random) {
  if (hi <= lo) return lo;
  // hi - lo fits in uint64 even for the full int64 range; span + 1 fits unless the range is
  // all of int64, where the top of the 128-bit product is the answer as it is.
  uint64_t span = uint64_t(hi.count()) - uint64_t(lo.count());
  unsigned __int128 scaled = span == std::numeric_limits<uint64_t>::max()
                                 ? (unsigned __int128)random << 64
                                 : (unsigned __int128)random * (span + 1);
  return nanoseconds(int64_t(uint64_t(lo.count()) + uint64_t(scaled >> 64)));
}

nanoseconds ExponentialBackoff(nanoseconds base, nanoseconds cap, uint32_t attempt) {
  int64_t b = NonNegative(base);
  int64_t c = NonNegative(cap);
  if (b >= c || b == 0) return nanoseconds(b >= c ? c : 0);
  // b << attempt <= c exactly when b <= c >> attempt: testing that first keeps the shift exact.
  if (attempt >= 63 || b > (c >> attempt)) return nanoseconds(c);
  return nanoseconds(std::min(c, b << attempt));
}

nanoseconds BackoffWait(Jitter jitter, nanoseconds base, nanoseconds cap, uint32_t attempt,
                        nanoseconds prev, uint64_t random) {
  switch (jitter) {
    case Jitter::kNone:
      return ExponentialBackoff(base, cap, attempt);
    case Jitter::kEqual: {
      int64_t exp = ExponentialBackoff(base, cap, attempt).count();
      int64_t half = exp / 2;
      return nanoseconds(half) + UniformBetween(nanoseconds(0), nanoseconds(exp - half), random);
    }
    case Jitter::kDecorrelated: {
      int64_t c = NonNegative(cap);
      int64_t b = std::min(NonNegative(base), c);
      int64_t p = std::max(NonNegative(prev), b);
      nanoseconds drawn = UniformBetween(nanoseconds(b), nanoseconds(SaturatingMul3(p)), random);
      return std::min(nanoseconds(c), drawn);
    }
    case Jitter::kFull:
      break;
  }
  return UniformBetween(nanoseconds(0), ExponentialBackoff(base, cap, attempt), random);
}

nanoseconds MergeWait(nanoseconds backoff, std::optional<nanoseconds> retry_after,
                      nanoseconds retry_after_jitter_max, uint64_t random) {
  int64_t wait = NonNegative(backoff);
  if (!retry_after) return nanoseconds(wait);
  int64_t jitter =
      UniformBetween(nanoseconds(0), nanoseconds(NonNegative(retry_after_jitter_max)), random)
          .count();
  return nanoseconds(std::max(wait, SaturatingAdd(NonNegative(*retry_after), jitter)));
}

Backoff::Backoff(BackoffOptions options, RandomSource random)
    : options_(options), random_(std::move(random)) {}

uint64_t Backoff::Draw() { return random_ ? random_() : ThreadLocalRandom(); }

nanoseconds Backoff::Next(uint32_t attempt, std::optional<nanoseconds> retry_after) {
  nanoseconds backoff =
      BackoffWait(options_.jitter, options_.base, options_.cap, attempt, prev_, Draw());
  prev_ = backoff;
  if (!retry_after) return backoff;
  return MergeWait(backoff, retry_after, options_.retry_after_jitter_max, Draw());
}

}  // namespace retryd
