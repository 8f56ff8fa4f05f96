#!/usr/bin/env python3
"""A tiny HTTP downstream on 127.0.0.1 for the stampede demo: finite capacity, a scheduled stall.

It serves GET /work with `--capacity` requests at once (a semaphore), each taking a lognormal
service time (median `--median_ms`, P99 `--p99_ms`); requests beyond wait their turn. From
`--stall_at_s` for `--stall_s` it stalls like a stop-the-world GC pause: nothing is read or
served, and what arrived meanwhile is read at once when the stall ends. A queue of more than
`--overload_queue` waiting requests for `--overload_ms` "crashes" it: for `--restart_s` every
request gets 503 at once (the pod is restarting behind its load balancer).

It counts, per 100 ms bin, the requests it read and the half-open probes among them (the
client marks them with `X-Retryd-Probe: 1`), and at the end (after `--duration_s`, or on
SIGTERM) writes a JSON summary to `--out` and one line to stdout.

Standard library only. Loopback only.
"""
import argparse
import json
import math
import os
import random
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BIN_S = 0.1


class State:
    def __init__(self, args):
        self.args = args
        self.t0 = time.monotonic()
        self.lock = threading.Lock()
        self.slots = threading.Semaphore(args.capacity)
        self.arrivals = {}
        self.probes = {}
        self.waiting = 0
        self.over_since = None
        self.crashed_until = -1.0
        self.crashes = 0
        self.probes_in_flight = 0
        self.max_probes_in_flight = 0
        self.mu = math.log(args.median_ms / 1000.0)
        self.sigma = math.log(args.p99_ms / args.median_ms) / 2.3263478740408408

    def now(self):
        return time.monotonic() - self.t0

    def stall_end(self):
        a = self.args
        return a.stall_at_s + a.stall_s if a.stall_s > 0 else -1.0

    def in_stall(self, t):
        a = self.args
        return a.stall_s > 0 and a.stall_at_s <= t < a.stall_at_s + a.stall_s


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state = None

    def log_message(self, *args):
        pass

    def reply(self, code, body=b"ok\n"):
        try:
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass  # the client gave up: the work was done for nothing

    def do_GET(self):
        st = self.state
        t = st.now()
        if st.in_stall(t):
            time.sleep(st.stall_end() - t)  # the process is frozen; the request waits unread
            t = st.now()
        probe = self.headers.get("X-Retryd-Probe") == "1"
        b = int(t / BIN_S)
        with st.lock:
            st.arrivals[b] = st.arrivals.get(b, 0) + 1
            if probe:
                st.probes[b] = st.probes.get(b, 0) + 1
                st.probes_in_flight += 1
                st.max_probes_in_flight = max(st.max_probes_in_flight, st.probes_in_flight)
        try:
            self.serve(st, t)
        finally:
            if probe:
                with st.lock:
                    st.probes_in_flight -= 1

    def serve(self, st, t):
        a = st.args
        if t < st.crashed_until:
            self.reply(503, b"restarting\n")
            return
        with st.lock:
            st.waiting += 1
            if st.waiting > a.overload_queue:
                if st.over_since is None:
                    st.over_since = t
                elif t - st.over_since >= a.overload_ms / 1000.0 and t >= st.crashed_until:
                    st.crashed_until = t + a.restart_s
                    st.crashes += 1
                    st.over_since = None
            else:
                st.over_since = None
        st.slots.acquire()
        with st.lock:
            st.waiting -= 1
        try:
            if st.now() < st.crashed_until:
                self.reply(503, b"restarting\n")
                return
            time.sleep(random.lognormvariate(st.mu, st.sigma))
            self.reply(200)
        finally:
            st.slots.release()


class Server(ThreadingHTTPServer):
    request_queue_size = 511  # listen backlog, as a real server would set it
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # a client that timed out and closed its connection is expected here


def summary(st):
    a = st.args
    n = int(a.duration_s / BIN_S) + 1
    arrivals = [st.arrivals.get(i, 0) for i in range(n)]
    probes = [st.probes.get(i, 0) for i in range(n)]
    peak_100 = max(arrivals) / BIN_S / a.baseline_qps if arrivals else 0
    peak_1s = max((sum(arrivals[i:i + 10]) for i in range(max(1, n - 9))), default=0) / a.baseline_qps
    probes_after_stall = sum(p for i, p in enumerate(probes) if i * BIN_S >= a.stall_at_s)
    return {
        "label": a.label,
        "arrivals": sum(arrivals),
        "peak_100ms_x_baseline": round(peak_100, 3),
        "peak_1s_x_baseline": round(peak_1s, 3),
        "probes": sum(probes),
        "probes_after_stall": probes_after_stall,
        "max_probes_in_flight": st.max_probes_in_flight,
        "crashes": st.crashes,
        "arrivals_per_bin": arrivals,
        "probes_per_bin": probes,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=0, help="0 picks a free port (printed)")
    p.add_argument("--port_file", default="", help="write the port here once listening")
    p.add_argument("--capacity", type=int, default=8)
    p.add_argument("--median_ms", type=float, default=15.0)
    p.add_argument("--p99_ms", type=float, default=45.0)
    p.add_argument("--stall_at_s", type=float, default=5.0)
    p.add_argument("--stall_s", type=float, default=1.4)
    p.add_argument("--overload_queue", type=int, default=64)
    p.add_argument("--overload_ms", type=float, default=1000.0)
    p.add_argument("--restart_s", type=float, default=5.0)
    p.add_argument("--duration_s", type=float, default=30.0)
    p.add_argument("--baseline_qps", type=float, default=200.0)
    p.add_argument("--label", default="downstream")
    p.add_argument("--out", default="", help="JSON summary file")
    a = p.parse_args()

    Handler.state = State(a)
    server = Server(("127.0.0.1", a.port), Handler)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    # t = 0 is when the server can take requests; the clients share it through --port_file.
    Handler.state.t0 = time.monotonic()
    if a.port_file:
        with open(a.port_file + ".tmp", "w") as f:
            f.write("%d %.6f\n" % (server.server_address[1], time.time()))
        os.replace(a.port_file + ".tmp", a.port_file)
    done.wait(a.duration_s + 6)
    server.shutdown()
    s = summary(Handler.state)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(s, f)
    print("%s downstream: %d requests read, peak %.2fx (100 ms) %.2fx (1 s), %d probes "
          "(%d after the stall, at most %d at once), %d overload crashes"
          % (a.label, s["arrivals"], s["peak_100ms_x_baseline"], s["peak_1s_x_baseline"],
             s["probes"], s["probes_after_stall"], s["max_probes_in_flight"], s["crashes"]))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
