# frozen_string_literal: true

# The cost of one admit + complete from Ruby, next to an empty Ruby method call, measured side
# by side in one run:
#
#   ruby -I bindings/ruby/lib bindings/ruby/bench/admit_bench.rb [N]
#
# Each loop runs N times (default 1,000,000); the loops take turns, 5 rounds, and each keeps
# its best round, so a busy machine slows them alike. The client runs on per-process limits
# (no daemon: the same atomic instructions on process memory) unless BENCH_SEGMENT=NAME or
# BENCH_SOCKET=PATH names a running daemon's segment or socket.
require "retryd"

N = Integer(ARGV[0] || 1_000_000)
ROUNDS = 5

def empty_method; end

client = if ENV["BENCH_SOCKET"]
           Retryd::Client.new(socket: ENV["BENCH_SOCKET"], fallback_to_local: false)
         elsif ENV["BENCH_SEGMENT"]
           Retryd::Client.new(segment: ENV["BENCH_SEGMENT"], fallback_to_local: false)
         else
           Retryd::Client.new(segment: "retryd-bench-absent-#{Process.pid}")
         end
dep = client.dependency("bench")
handle = client.handle
id = dep.id
raw = "\0".b * Retryd::Native::Permit.size

loops = {
  "empty loop (the loop alone)" => ->(n) { i = 0; while i < n; i += 1; end },
  "empty Ruby method call" => ->(n) { i = 0; while i < n; empty_method; i += 1; end },
  "admit + complete, raw FFI calls" => lambda do |n|
    i = 0
    while i < n
      Retryd::Native.retryd_admit(handle, id, 0, raw)
      Retryd::Native.retryd_complete(handle, raw, 0, 1000)
      i += 1
    end
  end,
  "dep.admit { } (block form)" => ->(n) { i = 0; while i < n; dep.admit { nil }; i += 1; end },
  "dep.admit.complete (permit form)" => ->(n) { i = 0; while i < n; dep.admit.complete; i += 1; end }
}
best = Hash.new(Float::INFINITY)
ROUNDS.times do
  loops.each do |label, body|
    GC.start
    t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
    body.call(N)
    ns = (Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond) - t0).to_f / N
    best[label] = ns if ns < best[label]
  end
end

puts "ruby #{RUBY_VERSION}, ffi #{FFI::VERSION}, #{Retryd.library_path}, " \
     "#{client.local? ? 'per-process limits (no daemon)' : 'a daemon\'s segment'}, " \
     "#{N} iterations, best of #{ROUNDS} interleaved rounds"
base = best["empty loop (the loop alone)"]
loops.each_key do |label|
  printf("  %-36s %8.1f ns/iteration  %8.1f ns above the loop\n", label, best[label], best[label] - base)
end
call = best["empty Ruby method call"] - base
printf("one admit + complete (block form) = %.0fx one empty method call; raw FFI = %.0fx\n",
       (best["dep.admit { } (block form)"] - base) / call,
       (best["admit + complete, raw FFI calls"] - base) / call)
client.close
