#!/usr/bin/env python3
"""The Lua binding's tests: its declarations and constants against the headers, its unit
scripts on plain LuaJIT against a real daemon, and a real nginx (4 workers, nginx's Lua module)
whose workers share one host-wide breaker and one retry budget through a real retryd.

  lua_binding_test.py constants --luajit FILE
  lua_binding_test.py unit      --luajit FILE --daemon FILE
  lua_binding_test.py nginx     --nginx FILE --daemon FILE --retryctl FILE
  lua_binding_test.py nginx-close --nginx FILE --daemon FILE --retryctl FILE

The library is $RETRYD_LIBRARY (ctest sets it to the build's). Every wait polls its condition
with a generous timeout: the machine may be loaded.
"""

import argparse
import collections
import concurrent.futures
import http.client
import http.server
import json
import os
import pathlib
import pwd
import grp
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading

ROOT = pathlib.Path(__file__).resolve().parents[3]
BINDING = ROOT / "bindings" / "lua"
HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from driver import TIMEOUT, Daemon, fail, free_port, log, wait_for  # noqa: E402


def lua_env(extra=None):
    env = dict(os.environ)
    env["LUA_PATH"] = f"{BINDING}/?.lua;{BINDING}/tests/?.lua;;"
    env.update(extra or {})
    return env


def luajit(binary, script, env, args=(), **kw):
    return subprocess.run([binary, str(BINDING / "tests" / script), *args], env=env, timeout=300,
                          **kw)


# ---- daemon ----------------------------------------------------------------------------------

# ---- constants and unit tests ----------------------------------------------------------------

def cmd_constants(args):
    r = luajit(args.luajit, "test_constants.lua", lua_env())
    sys.exit(r.returncode)


BREAKER = {"min_calls": 2, "failure_rate_threshold": 50, "open_for": "60s", "open_for_max": "60s"}
PROBE = {"min_calls": 2, "open_for": "300ms", "open_for_max": "300ms", "open_jitter": "0s",
         "half_open_probes": 1, "close_after": 1, "probe_timeout": "60s"}
NO_BUDGET = {"min_calls": 100000, "retry_burst": 1, "retry_ratio": 0, "min_retries_per_sec": 0}
UNIT_DEPS = {
    # test_admit.lua
    "unit_admit": {"min_calls": 100000},
    "unit_breaker": BREAKER,
    "unit_ignored": BREAKER,
    "unit_finalized": BREAKER,
    "unit_bulkhead": {"min_calls": 100000, "bulkhead_limit": 1},
    "unit_forced": {"mode": "forced-open"},
    "unit_budget": NO_BUDGET,
    "unit_probe": PROBE,
    # test_call.lua
    "unit_loop": {"min_calls": 100000, "retry_burst": 100000, "min_retries_per_sec": 100000},
    "unit_call_budget": NO_BUDGET,
    "unit_loop_breaker": BREAKER,
    "unit_call_raise": BREAKER,
    # min_calls 1: the one attempt a cancelled call leaves would open it if it were a failure.
    "unit_call_bulkhead": dict(BREAKER, min_calls=1, bulkhead_limit=1),
    "unit_call_probe": PROBE,
}


def run_local(binary, env):
    """test_local.lua on a segment nobody created, its stderr captured: the script's own
    checks, and exactly one library line about the fallback however many admits followed."""
    name = f"retryd-lua-absent-{os.getpid()}"
    env = dict(env, RETRYD_TEST_ABSENT=name)
    env.pop("RETRYD_SOCKET", None)
    r = luajit(binary, "test_local.lua", env, stderr=subprocess.PIPE, text=True)
    sys.stderr.write(r.stderr)
    if r.returncode != 0:
        return f"exited {r.returncode}"
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    about = [l for l in lines if name in l]
    if len(about) != 1 or len(lines) != 1:
        return f"expected exactly one line on stderr, naming {name}; got {lines}"
    log(f"test_local.lua: one log line after every admit: {about[0]}")
    return None


def exit_status(returncode):
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    return f"exited {returncode}"


def run_isolated(binary, script, env):
    """Each test of `script` in a process of its own, so that one that crashes the process
    (SIGSEGV) is reported by name and does not hide the others. Returns the names failed."""
    names = luajit(binary, script, env, stdout=subprocess.PIPE, text=True,
                   args=["--list"]).stdout.splitlines()
    failed = []
    for name in names:
        r = luajit(binary, script, dict(env, RETRYD_LUA_TEST=name))
        if r.returncode != 0:
            log(f"FAIL {script}: {name}: {exit_status(r.returncode)}")
            failed.append(name)
    if not names:
        failed.append(f"{script}: no tests listed")
    return failed


def cmd_unit(args):
    failed = passed = 0
    with tempfile.TemporaryDirectory(prefix="retryd-lua-unit-") as tmp:
        daemon = Daemon(args.daemon, tmp, UNIT_DEPS)
        try:
            env = lua_env({"RETRYD_SOCKET": daemon.sock})
            for name in ("test_admit.lua", "test_call.lua", "test_nul_bytes.lua"):
                r = luajit(args.luajit, name, env)
                if r.returncode == 0:
                    passed += 1
                else:
                    failed += 1
                    log(f"FAIL {name}: {exit_status(r.returncode)}")
            if run_isolated(args.luajit, "test_client_lifetime.lua", env):
                failed += 1
            else:
                passed += 1
            err = run_local(args.luajit, env)
            if err is None:
                passed += 1
            else:
                failed += 1
                log(f"FAIL test_local.lua: {err}")
        finally:
            daemon.stop()
    log(f"lua unit scripts: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


# ---- the nginx test --------------------------------------------------------------------------

WORKERS = 4
DOWNSTREAM = {
    "window": "3s",
    "window_buckets": 6,
    "min_calls": 6,
    "failure_rate_threshold": 50,
    "open_for": "2s",
    "open_for_max": "2s",
    "open_jitter": "0s",
    "half_open_probes": 1,
    "close_after": 1,
    "probe_timeout": "20s",
}
BUDGET = {
    "min_calls": 100000,     # never trips: only the budget refuses
    "retry_burst": 4,
    "retry_ratio": 0.1,
    "min_retries_per_sec": 0,
}


class Upstream:
    """The downstream nginx calls: an HTTP server on 127.0.0.1 that this test controls and
    that records every request (path, the attempt's query: probe, pid, attempt). /breaker
    answers 200 or 503 as `failing` says; while `hold` is set, a /breaker request waits for
    `release` (the probe, held in flight). /budget always answers 503."""

    def __init__(self):
        self.lock = threading.Lock()
        self.requests = []
        self.failing = False
        self.hold = False
        self.release = threading.Event()
        upstream = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                path, _, query = self.path.partition("?")
                fields = dict(p.split("=", 1) for p in query.split("&") if "=" in p)
                with upstream.lock:
                    upstream.requests.append((path, fields))
                    failing, hold = upstream.failing, upstream.hold
                if path == "/breaker" and hold:
                    upstream.release.wait(60)
                status = 503 if path == "/budget" or (path == "/breaker" and failing) else 200
                body = b"ok\n" if status == 200 else b"down\n"
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def seen(self, path):
        with self.lock:
            return [f for p, f in self.requests if p == path]

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


NGINX_CONF = """\
# The nginx of lua_binding_test.py: 4 workers, run from a private prefix.
worker_processes {workers};
daemon off;
master_process on;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
{user}
load_module /usr/lib/nginx/modules/ndk_http_module.so;
load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;
# nginx clears its workers' environment but for these.
env RETRYD_LIBRARY;
env RETRYD_SOCKET;
env UPSTREAM_PORT;

events {{
    worker_connections 512;
}}

http {{
    access_log off;
    client_body_temp_path {prefix}/tmp/body;
    proxy_temp_path {prefix}/tmp/proxy;
    fastcgi_temp_path {prefix}/tmp/fastcgi;
    uwsgi_temp_path {prefix}/tmp/uwsgi;
    scgi_temp_path {prefix}/tmp/scgi;

    lua_package_path "{binding}/?.lua;{here}/?.lua;;";
    init_worker_by_lua_block {{
        require("nginx_app").init_worker()
    }}

    server {{
        # reuseport: a listening socket per worker, so that connections spread over all four.
        listen 127.0.0.1:{port} reuseport;

        location = /breaker {{
            content_by_lua_block {{
                require("nginx_app").breaker()
            }}
        }}
        location = /budget {{
            access_by_lua_block {{
                require("nginx_app").budget()
            }}
        }}
        location = /waiting {{
            content_by_lua_block {{
                require("nginx_app").waiting()
            }}
        }}
        location = /close {{
            content_by_lua_block {{
                require("nginx_app").close()
            }}
        }}
        location /upstream/ {{
            internal;
            proxy_pass http://127.0.0.1:{upstream}/;
            proxy_read_timeout 60s;
        }}
    }}
}}
"""


class Nginx:
    def __init__(self, binary, tmp, env, workers=WORKERS):
        self.prefix = pathlib.Path(tmp) / "nginx"
        (self.prefix / "tmp").mkdir(parents=True)
        self.port = free_port()
        user = ""
        if os.geteuid() == 0:
            # As root, nginx would run its workers as nobody: keep them the test's user.
            user = (f"user {pwd.getpwuid(os.geteuid()).pw_name} "
                    f"{grp.getgrgid(os.getegid()).gr_name};")
        self.conf = self.prefix / "nginx.conf"
        self.conf.write_text(NGINX_CONF.format(
            workers=workers, prefix=self.prefix, user=user, binding=BINDING, here=HERE,
            port=self.port, upstream=env["UPSTREAM_PORT"]))
        self.error_log = self.prefix / "error.log"
        self.out = open(self.prefix / "nginx.out", "w")
        # -e: the error log from the start, so nginx never opens /var/log/nginx.
        self.proc = subprocess.Popen(
            [binary, "-p", str(self.prefix), "-c", str(self.conf), "-e", str(self.error_log)],
            env=dict(os.environ, **env), stdout=self.out, stderr=self.out)

        def up():
            if self.proc.poll() is not None:
                fail("nginx exited: " + self.logs())
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return True
            except OSError:
                return False
        wait_for("nginx to listen", up)

    def logs(self):
        text = ""
        for p in (self.prefix / "nginx.out", self.error_log):
            if p.exists():
                text += f"--- {p.name}\n" + p.read_text()[-6000:]
        return text

    def get(self, path):
        """GET `path` on a connection of its own; returns the JSON answer."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=TIMEOUT)
        try:
            conn.request("GET", path, headers={"Connection": "close"})
            response = conn.getresponse()
            body = response.read()
        finally:
            conn.close()
        if response.status != 200:
            fail(f"GET {path}: {response.status} {body!r}\n{self.logs()}")
        return json.loads(body)

    def batch(self, path, n):
        with concurrent.futures.ThreadPoolExecutor(n) as pool:
            return list(pool.map(lambda _: self.get(path), range(n)))

    def stop(self):
        """Stops nginx gracefully (SIGQUIT); True if it exited 0."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.out.close()
        return self.proc.returncode == 0


class Load:
    """Threads sending GET `path` one after another, each on a connection of its own, until
    stopped; every answer is kept."""

    def __init__(self, nginx, path, threads):
        self.nginx = nginx
        self.path = path
        self.answers = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(threads)]
        for t in self.threads:
            t.start()

    def run(self):
        while not self.stopping.is_set():
            a = self.nginx.get(self.path)
            with self.lock:
                self.answers.append(a)

    def since(self, n):
        with self.lock:
            return self.answers[n:]

    def count(self):
        with self.lock:
            return len(self.answers)

    def stop(self):
        self.stopping.set()
        for t in self.threads:
            t.join(TIMEOUT)


class Ctl:
    def __init__(self, binary, sock):
        self.binary = binary
        self.sock = sock

    def json(self, *what):
        r = subprocess.run([self.binary, "--socket", self.sock, *what, "--json"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
        if r.returncode not in (0, 1):
            fail(f"retryctl {' '.join(what)} exited {r.returncode}: {r.stderr}")
        return json.loads(r.stdout)

    def dep(self, name):
        for d in self.json("status")["dependencies"]:
            if d["name"] == name:
                return d
        fail(f"retryctl status shows no dependency {name!r}")


# Lines of nginx's error log that are no problem (the log is at level warn: none expected).
QUIET = re.compile(r"\[(notice|info)\]")


def check_error_log(nginx):
    """Nothing at level warn or above in the error log, and no line of anything else: the
    workers' stderr is the error log, so a line of libretryd (its fallback to per-process
    limits, say) would be there. Nothing on the master's stdout or stderr either."""
    text = nginx.error_log.read_text() if nginx.error_log.exists() else ""
    bad = [l for l in text.splitlines() if l.strip() and not QUIET.search(l)]
    if bad:
        fail("nginx's error log has warnings, errors or stray lines:\n" + "\n".join(bad[:20]))
    out = (nginx.prefix / "nginx.out").read_text()
    if out.strip():
        fail("nginx wrote on its stdout or stderr:\n" + out[-2000:])
    log(f"error log: no warning, error or stray line ({len(text.splitlines())} lines in all)")


def cmd_nginx(args):
    with tempfile.TemporaryDirectory(prefix="retryd-lua-nginx-") as tmp:
        os.chmod(tmp, 0o755)
        daemon = Daemon(args.daemon, tmp, {"downstream": DOWNSTREAM, "budget": BUDGET})
        upstream = Upstream()
        nginx = None
        try:
            nginx = Nginx(args.nginx, tmp, {
                "RETRYD_SOCKET": daemon.sock,
                "RETRYD_LIBRARY": os.environ.get("RETRYD_LIBRARY", ""),
                "UPSTREAM_PORT": str(upstream.port),
            })
            ctl = Ctl(args.retryctl, daemon.sock)
            pids = run_breaker_test(nginx, ctl, upstream)
            run_budget_test(nginx, ctl, upstream, pids)
            if not nginx.stop():
                fail(f"nginx exited {nginx.proc.returncode} on SIGQUIT\n{nginx.logs()}")
            check_error_log(nginx)
        except SystemExit:
            if nginx:
                log(nginx.logs())
            log("--- retryd log\n" + daemon.log_path.read_text()[-4000:])
            raise
        finally:
            upstream.release.set()
            if nginx:
                nginx.stop()
            upstream.close()
            daemon.stop()
    log("lua_nginx_test: 1 passed, 0 failed")


def run_breaker_test(nginx, ctl, upstream):
    batch = 2 * WORKERS
    answers = []

    # 1. Upstream up: every worker serves, attached to the daemon (not on per-process limits).
    pids = set()

    def all_workers_served():
        got = nginx.batch("/breaker", batch)
        answers.extend(got)
        for a in got:
            if a["status"] != 200 or a["local"]:
                fail(f"a request failed, or ran on per-process limits, upstream up: {a}")
            pids.add(a["pid"])
        return len(pids) >= WORKERS
    wait_for(f"requests served by {WORKERS} nginx workers", all_workers_served, interval=0)
    workers = ctl.json("workers")["workers"]
    live = {w["pid"] for w in workers if w["state"] == "live"}
    if not pids <= live:
        fail(f"retryctl workers lists {sorted(live)}, not every nginx worker of {sorted(pids)}")
    log(f"up: {len(answers)} requests served by workers {sorted(pids)}, each a live process "
        f"in retryctl workers")

    # 2. Upstream failing: the workers' failures open one breaker for the host.
    upstream.failing = True
    failing_pids = set()

    def opened():
        got = nginx.batch("/breaker", batch)
        answers.extend(got)
        for a in got:
            if a["status"] == 200:
                fail(f"a request succeeded with the upstream failing: {a}")
            if a["sent"]:
                failing_pids.add(a["pid"])
        dep = ctl.dep("downstream")
        return dep if dep["breaker"]["state"] == "open" else None
    dep = wait_for("the breaker to open", opened, interval=0)
    if len(failing_pids) < 2:
        fail(f"the failures that opened the breaker came from {sorted(failing_pids)} alone")
    # Read as soon as it is open (a probe failing later would reopen it).
    if dep["counters"]["opened"] != 1:
        fail(f"the breaker opened {dep['counters']['opened']} times, expected once")
    log(f"failing: the breaker opened once, on failures sent by workers {sorted(failing_pids)}")

    # Every worker is refused by that one breaker, sending nothing.
    refused = set()

    def every_worker_refused():
        got = nginx.batch("/breaker", batch)
        answers.extend(got)
        refused.update(a["pid"] for a in got if a["rejected"] == "open" and a["sent"] == 0)
        return refused >= pids
    wait_for("every worker to be refused by the open breaker", every_worker_refused, interval=0)
    dep = ctl.dep("downstream")
    c = dep["counters"]
    sent = sum(a["sent"] for a in answers)
    at_upstream = len(upstream.seen("/breaker"))
    if not sent == at_upstream == c["successes"] + c["failures"] + c["ignored"]:
        fail(f"workers sent {sent}, the upstream got {at_upstream}, the host counted "
             f"{c['successes']} + {c['failures']} + {c['ignored']}")
    per_worker = collections.Counter(a["pid"] for a in answers if a["sent"])
    log(f"open: workers {sorted(refused)} refused; the host counted every worker's attempts: "
        f"{sent} sent ({dict(per_worker)}) = upstream {at_upstream} = successes "
        f"{c['successes']} + failures {c['failures']}; rejected_open {c['rejected_open']}")

    # 3. Recovery: the upstream answers again, but holds the first request (the probe) in
    # flight. Exactly one request reaches it; every worker is refused half_open_busy meanwhile.
    wait_for("the breaker open with no probe in flight", lambda: (
        lambda d: d["breaker"]["state"] == "open" and d["breaker"]["probes_in_flight"] == 0)(
            ctl.dep("downstream")))
    dep = ctl.dep("downstream")
    probes_before, closed_before = dep["counters"]["probes_granted"], dep["counters"]["closed"]
    before = len(upstream.seen("/breaker"))
    with upstream.lock:
        upstream.hold, upstream.failing = True, False
    load = Load(nginx, "/breaker", 2 * WORKERS)
    try:
        wait_for("the probe to reach the upstream",
                 lambda: len(upstream.seen("/breaker")) > before)
        mark = load.count()
        busy = set()

        def every_worker_busy():
            busy.update(a["pid"] for a in load.since(mark)
                        if a["rejected"] == "half_open_busy" and a["sent"] == 0)
            return busy >= pids
        wait_for("every worker refused half_open_busy while the probe is out", every_worker_busy)
        dep = ctl.dep("downstream")
        held = upstream.seen("/breaker")[before:]
        if len(held) != 1 or held[0].get("probe") != "1":
            fail(f"while the probe was out the upstream got {held}, expected the one probe")
        if dep["breaker"]["state"] != "half-open" or dep["breaker"]["probes_in_flight"] != 1:
            fail(f"while the probe is out: {dep['breaker']}")
        log(f"half-open: the upstream got exactly 1 request, the probe (from worker "
            f"{held[0]['pid']}); workers {sorted(busy)} refused half_open_busy meanwhile")
        upstream.hold = False
        upstream.release.set()
        wait_for("the breaker to close",
                 lambda: ctl.dep("downstream")["breaker"]["state"] == "closed")
        served = set()

        def every_worker_served():
            served.update(a["pid"] for a in load.since(mark) if a["status"] == 200)
            return served >= pids
        wait_for("every worker to succeed again", every_worker_served)
    finally:
        upstream.release.set()
        load.stop()
    dep = ctl.dep("downstream")
    probes = dep["counters"]["probes_granted"] - probes_before
    if probes != 1 or dep["counters"]["closed"] != closed_before + 1:
        fail(f"probes granted {probes}, closed {closed_before} -> {dep['counters']['closed']}: "
             "expected one probe and one close")
    log(f"closed: after exactly 1 probe (probes_granted +{probes}); workers {sorted(served)} "
        f"succeed again")
    return pids


def run_budget_test(nginx, ctl, upstream, pids):
    # Every attempt fails (503) and wants two retries: the host's retry budget, shared by the
    # four workers, grants at most retry_burst + retry_ratio x first attempts of them.
    answers = []
    for _ in range(6):
        answers.extend(nginx.batch("/budget", 2 * WORKERS))
    dep = ctl.dep("budget")
    c = dep["counters"]
    granted, denied, first = c["retries_granted"], c["retries_denied"], c["first_attempts"]
    bound = BUDGET["retry_burst"] + BUDGET["retry_ratio"] * first
    sent = sum(a["sent"] for a in answers)
    at_upstream = len(upstream.seen("/budget"))
    if first != len(answers):
        fail(f"first_attempts {first}, but {len(answers)} requests")
    if granted > bound:
        fail(f"retries granted {granted} > retry_burst + retry_ratio x first attempts = {bound}")
    if denied == 0:
        fail("no retry was denied: the budget was never spent")
    if not sent == at_upstream == first + granted:
        fail(f"workers sent {sent}, the upstream got {at_upstream}, first attempts {first} + "
             f"retries granted {granted}")
    for a in answers:
        # The one behaviour: a refused retry returns the last response, never "rejected".
        if a["status"] != 503 or a["sent"] == 0 or a["err"] is not None:
            fail(f"a call did not return its last 503: {a}")
        if a["stop"] == "rejected" and a["rejected"] != "budget_empty":
            fail(f"a call refused for another reason than the budget: {a}")
    # One budget for the four: every worker called and was refused retries by it, and the
    # retries granted to all of them together stay within what one budget allows (with a
    # budget each, every worker could have had retry_burst retries and more).
    callers = {a["pid"] for a in answers}
    refused_by = {a["pid"] for a in answers if a["rejected"] == "budget_empty"}
    if callers != pids or refused_by != pids:
        fail(f"calls came from workers {sorted(callers)}, refused by the budget in "
             f"{sorted(refused_by)}: expected all of {sorted(pids)}")
    retried = collections.Counter(a["pid"] for a in answers if a["sent"] > 1)
    refused = sum(1 for a in answers if a["rejected"] == "budget_empty")
    log(f"budget: {len(answers)} calls from workers {sorted(callers)}, each refused retries: "
        f"{first} first attempts, {granted} retries granted (<= {BUDGET['retry_burst']} + "
        f"{BUDGET['retry_ratio']} x {first} = {bound:g}; calls retried by worker "
        f"{dict(retried)}), {denied} denied; {refused} calls ended on budget_empty, each "
        f"returning its last 503; the upstream got {at_upstream} = {first} + {granted}")


def cmd_nginx_close(args):
    """One nginx worker: a request inside dep:call, waiting in ngx.sleep before its retry,
    while another request of the same worker closes the worker's client. The call must end,
    cancelled, with its last response (the one 503 it got) and no retry sent, and the worker
    must not die of it: nginx's error log holds no 'exited on signal'."""
    with tempfile.TemporaryDirectory(prefix="retryd-lua-nginx-close-") as tmp:
        os.chmod(tmp, 0o755)
        daemon = Daemon(args.daemon, tmp, {"downstream": DOWNSTREAM, "budget": BUDGET})
        nginx = None
        try:
            nginx = Nginx(args.nginx, tmp, {
                "RETRYD_SOCKET": daemon.sock,
                "RETRYD_LIBRARY": os.environ.get("RETRYD_LIBRARY", ""),
                "UPSTREAM_PORT": str(free_port()),
            }, workers=1)
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                waiting = pool.submit(raw_get, nginx.port, "/waiting?wait=1")
                # The call's first attempt is out and its wait begun before the close.
                wait_for("the call to wait before its retry", lambda: (
                    lambda d: d["retries"]["first_attempts"] >= 1)(Ctl(args.retryctl,
                                                                       daemon.sock).dep("budget")))
                closed = raw_get(nginx.port, "/close")
                log(f"/close: {closed.splitlines()[0] if closed else '(no answer)'}")
                answer = waiting.result(TIMEOUT)
            log(f"/waiting, its client closed during its wait: "
                f"{answer.splitlines()[0] if answer else '(connection closed, no answer)'}")
            # Stopped first: the master has then reaped its workers and logged how they ended.
            nginx.stop()
            crashed = [l for l in nginx.error_log.read_text().splitlines()
                       if "exited on signal" in l]
            if crashed:
                fail("a worker died when its client was closed during dep:call:\n" +
                     "\n".join(crashed))
            if not answer:
                fail("the request inside dep:call got no answer")
            body = json.loads(answer.split("\r\n\r\n", 1)[1])
            if (body.get("stop"), body.get("sent"), body.get("status")) != ("cancelled", 1, 503):
                fail(f"the call whose client was closed during its wait should end cancelled "
                     f"after its one attempt, with its 503: {body}")
        finally:
            if nginx:
                nginx.stop()
            daemon.stop()
    log("lua_nginx_close_test: 1 passed, 0 failed")


def raw_get(port, path):
    """GET `path` over HTTP/1.0; the whole answer as text, or "" if the connection closed
    without one (a worker that died)."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as s:
        s.sendall(f"GET {path} HTTP/1.0\r\nHost: test\r\n\r\n".encode())
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return data.decode(errors="replace")
            data += chunk


def main():
    p = argparse.ArgumentParser()
    p.add_argument("step", choices=["constants", "unit", "nginx", "nginx-close"])
    p.add_argument("--luajit", default="luajit")
    p.add_argument("--nginx", default="nginx")
    p.add_argument("--daemon")
    p.add_argument("--retryctl")
    args = p.parse_args()
    {"constants": cmd_constants, "unit": cmd_unit, "nginx": cmd_nginx,
     "nginx-close": cmd_nginx_close}[args.step](args)


if __name__ == "__main__":
    main()
