"""The cost of one admit + complete from Python, through the C Permit (retryd._speedups) and
through the ctypes one, next to an empty Python function call, measured side by side in one
run:

    RETRYD_PYTHON_EXTENSION=build/tests/client/python/_speedups.abi3.so \\
        PYTHONPATH=bindings/python python3 bindings/python/bench/admit_bench.py [N]

(RETRYD_PYTHON_EXTENSION: the module the build tree's `retryd_python_speedups` target builds;
an installed package, or `setup.py build_ext --inplace`, has it in the package.) Without the
extension the C loop is left out.

Each loop runs N times (default 1,000,000); the loops take turns, 5 rounds, and each keeps its
best round, so a busy machine slows them alike. `with dep.admit(): pass` is what callers
write, and what the C Permit serves where it is built; the ctypes loop calls a function that
constructs the ctypes Permit, as Dependency.admit does without the extension (or with
RETRYD_PYTHON_PURE=1). The client runs on per-process limits (no daemon: the same atomic
instructions on process memory) unless BENCH_SEGMENT=NAME or BENCH_SOCKET=PATH names a running
daemon's segment or socket.
"""

import os
import sys
import time

import retryd
from retryd import _client

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
    ctypes_permit = _client._PythonPermit

    def admit_ctypes(attempt=0):
        return ctypes_permit(dep, attempt)

    def loop_empty():
        for _ in range(N):
            empty()

    def loop_admit():
        for _ in range(N):
            with dep.admit():
                pass

    def loop_ctypes():
        for _ in range(N):
            with admit_ctypes():
                pass

    loops = {"empty Python function call": loop_empty}
    if _client._speedups is not None:
        loops["with dep.admit(): pass (C)"] = loop_admit
    loops["the same through ctypes"] = loop_ctypes
    best = {name: float("inf") for name in loops}
    for _ in range(ROUNDS):
        for name, loop in loops.items():
            start = time.perf_counter_ns()
            loop()
            best[name] = min(best[name], (time.perf_counter_ns() - start) / N)
    base = best["empty Python function call"]
    print(f"{'local' if client.local else 'attached'}, Python {sys.version.split()[0]}, "
          f"best of {ROUNDS} rounds of {N:,}:")
    if _client._speedups is None:
        print("  (retryd._speedups not found: the C Permit is not measured)")
    for name, ns in best.items():
        print(f"  {name:30s} {ns:8.1f} ns  ({ns / base:5.1f}x)")


if __name__ == "__main__":
    main()
