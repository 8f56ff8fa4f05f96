"""The cost of one admit + complete from Python, next to an empty Python function call,
measured side by side in one run:

    PYTHONPATH=bindings/python python3 bindings/python/bench/admit_bench.py [N]

Each loop runs N times (default 1,000,000); the loops take turns, 5 rounds, and each keeps its
best round, so a busy machine slows them alike. The client runs on per-process limits (no
daemon: the same atomic instructions on process memory) unless BENCH_SEGMENT=NAME or
BENCH_SOCKET=PATH names a running daemon's segment or socket.
"""

import os
import sys
import time

import retryd

N = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
ROUNDS = 5


def empty():
    pass


def main():
    if os.environ.get("BENCH_SOCKET"):
        client = retryd.Client(socket=os.environ["BENCH_SOCKET"])
    elif os.environ.get("BENCH_SEGMENT"):
        client = retryd.Client(segment=os.environ["BENCH_SEGMENT"])
    else:
        client = retryd.Client(segment=f"retryd-bench-absent-{os.getpid()}")
    dep = client.dependency("bench")

    def loop_empty():
        for _ in range(N):
            empty()

    def loop_admit():
        for _ in range(N):
            with dep.admit():
                pass

    loops = {"empty Python function call": loop_empty, "with dep.admit(): pass": loop_admit}
    best = {name: float("inf") for name in loops}
    for _ in range(ROUNDS):
        for name, loop in loops.items():
            start = time.perf_counter_ns()
            loop()
            best[name] = min(best[name], (time.perf_counter_ns() - start) / N)
    base = best["empty Python function call"]
    print(f"{'local' if client.local else 'attached'}, best of {ROUNDS} rounds of {N:,}:")
    for name, ns in best.items():
        print(f"  {name:30s} {ns:8.1f} ns  ({ns / base:5.1f}x)")


if __name__ == "__main__":
    main()
