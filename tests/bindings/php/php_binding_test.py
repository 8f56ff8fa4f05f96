#!/usr/bin/env python3
"""The PHP binding's tests: the extension loads, its constants, its unit tests, and a real
php-fpm pool sharing one host-wide breaker through a real retryd.

  php_binding_test.py loads     --ext-dir DIR
  php_binding_test.py constants --ext-dir DIR --include DIR
  php_binding_test.py unit      --ext-dir DIR --daemon FILE
  php_binding_test.py server    --ext-dir DIR --daemon FILE --retryctl FILE

The extension is DIR/retryd.so, built by CMake (tests/bindings/php/CMakeLists.txt); `loads`
checks that php loads it, and the other steps load it with `php -d extension=`. Every wait
polls its condition with a generous timeout: the machine may be loaded.
"""

import argparse
import collections
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[3]
BINDING = ROOT / "bindings" / "php"
HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from driver import Daemon, answers, fail, free_port, log, wait_for  # noqa: E402


def extension(args):
    so = pathlib.Path(args.ext_dir).resolve() / "retryd.so"   # absolute: some run elsewhere
    if not so.exists():
        fail(f"{so} missing: run the build step first")
    return str(so)


# ---- loads ----------------------------------------------------------------------------------

def cmd_loads(args):
    so = extension(args)
    r = subprocess.run(["php", "-n", "-d", f"extension={so}", "-r",
                        "echo extension_loaded('retryd') ? 'loaded' : 'missing';"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.stdout.strip() != "loaded":
        fail("php does not load the built extension: " + r.stdout)
    log(f"php loads {so}")
    log("loads: 1 passed, 0 failed")


# ---- daemon ----------------------------------------------------------------------------------

# ---- constants and unit tests ----------------------------------------------------------------

def php(ext, script, env=None, timeout=300, **kw):
    return subprocess.run(["php", "-d", f"extension={ext}", "-d", "zend.assertions=1",
                           "-d", "display_errors=stderr", script],
                          env=env, timeout=timeout, **kw)


def php_has(module):
    r = subprocess.run(["php", "-m"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                       text=True)
    return module in r.stdout.split()


def cmd_constants(args):
    env = dict(os.environ, RETRYD_INCLUDE=args.include)
    r = php(extension(args), str(BINDING / "tests" / "test_constants.php"), env)
    sys.exit(r.returncode)


UNIT_DEPS = {
    "unit_bulkhead": {"bulkhead_limit": 1},
    "unit_breaker": {"min_calls": 2, "failure_rate_threshold": 50, "open_for": "60s",
                     "open_for_max": "60s"},
    "unit_loop_breaker": {"min_calls": 2, "failure_rate_threshold": 50, "open_for": "60s",
                          "open_for_max": "60s"},
    "unit_guzzle_open": {"min_calls": 2, "failure_rate_threshold": 50, "open_for": "60s",
                         "open_for_max": "60s"},
    "unit_loop": {"min_calls": 100000, "retry_burst": 100000, "min_retries_per_sec": 100000},
    "unit_guzzle": {"min_calls": 100000, "retry_burst": 100000, "min_retries_per_sec": 100000},
    "unit_guzzle_breaker": {"min_calls": 100000},
    "unit_guzzle_budget": {"min_calls": 100000, "retry_burst": 1, "retry_ratio": 0,
                           "min_retries_per_sec": 0},
    "unit_fork_bulkhead": {"bulkhead_limit": 1, "bulkhead_timeout": "24h"},
    "unit_fork_parent": {"bulkhead_limit": 1, "bulkhead_timeout": "24h"},
    "unit_state": {"min_calls": 2, "failure_rate_threshold": 50, "open_for": "1s",
                   "open_for_max": "1s", "open_jitter": "0s", "close_after": 1,
                   "probe_timeout": "60s"},
    "unit_state_call": {"min_calls": 2, "failure_rate_threshold": 50, "open_for": "60s",
                        "open_for_max": "60s"},
}


def run_local(ext, env):
    """test_local.php on a segment nobody created, its stderr captured: the script's own
    checks, and exactly one library line about the fallback however many admits followed."""
    name = f"retryd-php-absent-{os.getpid()}"
    env = dict(env, RETRYD_TEST_ABSENT=name)
    env.pop("RETRYD_SOCKET", None)
    r = php(ext, str(BINDING / "tests" / "test_local.php"), env, stderr=subprocess.PIPE,
            text=True)
    sys.stderr.write(r.stderr)
    if r.returncode != 0:
        return f"exited {r.returncode}"
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    about = [l for l in lines if name in l]
    if len(about) != 1:
        return f"expected exactly one log line naming {name}, got {len(about)}: {about}"
    if len(lines) != 1:
        return f"expected only that line on stderr, got {lines}"
    log(f"test_local.php: one log line after every admit: {about[0]}")
    return None


def run_permission(ext, binary, env):
    """test_permission.php as user nobody against a daemon with allow_users = ["root"]."""
    if os.geteuid() != 0:
        log("SKIP test_permission.php: needs root to run PHP as nobody "
            f"(running as uid {os.geteuid()})")
        return None
    with tempfile.TemporaryDirectory(prefix="retryd-php-deny-") as tmp:
        os.chmod(tmp, 0o755)   # nobody reaches the socket, and is refused by the daemon
        daemon = Daemon(binary, tmp, {}, {"mode": "0666", "allow_users": ["root"]})
        # nobody loads the extension and reads the scripts from here: the clone may be in a
        # directory only root can enter.
        shutil.copy(ext, tmp)
        for name in ("lib.php", "test_permission.php"):
            shutil.copy(BINDING / "tests" / name, tmp)
        # ... and the library the extension links, which the build tree holds.
        ldd = subprocess.run(["ldd", ext], stdout=subprocess.PIPE, text=True).stdout
        for line in ldd.splitlines():
            parts = line.split()
            if parts and parts[0].startswith("libretryd.so") and len(parts) >= 3:
                shutil.copy(parts[2], pathlib.Path(tmp) / parts[0])
        try:
            env = dict(env, RETRYD_DENY_SOCKET=daemon.sock, HOME=tmp, LD_LIBRARY_PATH=tmp)
            env.pop("RETRYD_SOCKET", None)
            r = php(str(pathlib.Path(tmp) / pathlib.Path(ext).name),
                    str(pathlib.Path(tmp) / "test_permission.php"), env, cwd=tmp,
                    user=65534, group=65534, extra_groups=[])
            if r.returncode != 0:
                log("--- retryd log\n" + daemon.log_path.read_text()[-4000:])
                return f"exited {r.returncode}"
        finally:
            daemon.stop()
    return None


def run_stopped(ext, binary, env):
    """test_stopped.php against a daemon of its own, stopped (SIGSTOP) before the script starts
    and resumed when the script says it runs on per-process limits."""
    with tempfile.TemporaryDirectory(prefix="retryd-php-stopped-") as tmp:
        daemon = Daemon(binary, tmp, {"orders": {}})
        daemon.proc.send_signal(signal.SIGSTOP)
        try:
            env = dict(env, RETRYD_STOPPED_SOCKET=daemon.sock)
            env.pop("RETRYD_SOCKET", None)
            p = subprocess.Popen(["php", "-d", f"extension={ext}", "-d", "zend.assertions=1",
                                  "-d", "display_errors=stderr",
                                  str(BINDING / "tests" / "test_stopped.php")],
                                 env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            said = p.stdout.readline().strip()
            daemon.proc.send_signal(signal.SIGCONT)
            if said != "local":
                p.kill()
                p.wait()
                return f"the script said {said!r} before the daemon resumed"
            p.stdin.write("go\n")
            p.stdin.flush()
            out, _ = p.communicate(timeout=300)
            sys.stdout.write(out)
            if p.returncode != 0:
                return f"exited {p.returncode}"
        finally:
            daemon.proc.send_signal(signal.SIGCONT)
            daemon.stop()
    return None


def run_fork(ext, env):
    if not php_has("pcntl") or not php_has("posix"):
        log("SKIP test_fork.php: php-cli has no pcntl/posix extension (php -m)")
        return None
    r = php(ext, str(BINDING / "tests" / "test_fork.php"), env)
    return f"exited {r.returncode}" if r.returncode != 0 else None


def cmd_unit(args):
    ext = extension(args)
    failed = passed = 0
    with tempfile.TemporaryDirectory(prefix="retryd-php-unit-") as tmp:
        daemon = Daemon(args.daemon, tmp, UNIT_DEPS)
        try:
            env = dict(os.environ, RETRYD_SOCKET=daemon.sock, RETRYD_PHP_EXTENSION=ext)
            for name in ("test_admit.php", "test_call.php", "test_guzzle.php",
                         "test_state_change.php"):
                r = php(ext, str(BINDING / "tests" / name), env)
                if r.returncode == 0:
                    passed += 1
                else:
                    failed += 1
                    log(f"{name} exited {r.returncode}")
            for name, run in (("test_local.php", lambda: run_local(ext, env)),
                              ("test_permission.php", lambda: run_permission(ext, args.daemon, env)),
                              ("test_fork.php", lambda: run_fork(ext, env)),
                              ("test_stopped.php", lambda: run_stopped(ext, args.daemon, env))):
                err = run()
                if err is None:
                    passed += 1
                else:
                    failed += 1
                    log(f"FAIL {name}: {err}")
        finally:
            daemon.stop()
    log(f"php unit scripts: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


# ---- the php-fpm server test -----------------------------------------------------------------

CHILDREN = 4
SERVER_DEP = {
    "window": "3s",
    "window_buckets": 6,
    "min_calls": 6,
    "failure_rate_threshold": 50,
    "open_for": "5s",
    "open_for_max": "5s",
    "open_jitter": "0s",
    "half_open_probes": 1,
    "close_after": 1,
    "probe_timeout": "20s",
    "retry_ratio": 0.2,
}


def tcp_answers(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


class Downstream:
    """python3's http.server on 127.0.0.1:PORT serving one file; stopped and started again."""

    def __init__(self, tmp, port):
        self.dir = pathlib.Path(tmp) / "www"
        self.dir.mkdir(exist_ok=True)
        (self.dir / "ok.txt").write_text("ok\n")
        self.port = port
        self.proc = None
        self.log = open(pathlib.Path(tmp) / "downstream.log", "a")

    def start(self):
        def started():
            if self.proc is None or self.proc.poll() is not None:
                # The port of a stopped server can stay taken for a moment: try again.
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "http.server", "--bind", "127.0.0.1",
                     "--directory", str(self.dir), str(self.port)],
                    stdout=self.log, stderr=self.log)
                time.sleep(0.1)
            return tcp_answers(self.port)
        wait_for("the downstream to listen", started, interval=0.1)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        self.proc = None
        wait_for("the downstream to stop listening", lambda: not tcp_answers(self.port))

    def close(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


class Fpm:
    def __init__(self, tmp, ext, env):
        self.tmp = pathlib.Path(tmp)
        self.sock = str(self.tmp / "fpm.sock")
        conf = self.tmp / "php-fpm.conf"
        lines = [
            "[global]",
            f"pid = {self.tmp / 'fpm.pid'}",
            f"error_log = {self.tmp / 'fpm.log'}",
            "daemonize = no",
            "[pool]",
            f"listen = {self.sock}",
            "pm = static",
            f"pm.max_children = {CHILDREN}",
            "catch_workers_output = yes",
            "clear_env = yes",
            "request_terminate_timeout = 60s",
        ]
        for k, v in env.items():
            lines.append(f"env[{k}] = {v}")
        conf.write_text("\n".join(lines) + "\n")
        binary = shutil.which("php-fpm8.2", path="/usr/sbin:/usr/bin:" + os.environ.get("PATH", "")) \
            or shutil.which("php-fpm", path="/usr/sbin:/usr/bin:" + os.environ.get("PATH", ""))
        if not binary:
            fail("php-fpm not found (apt-get install php-fpm)")
        cmd = [binary, "--nodaemonize", "--fpm-config", str(conf), "-d", f"extension={ext}"]
        if os.geteuid() == 0:
            cmd.append("--allow-to-run-as-root")
        self.log = open(self.tmp / "fpm.out", "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log)

        def up():
            if self.proc.poll() is not None:
                fail("php-fpm exited: " + self.logs())
            return os.path.exists(self.sock) and answers(self.sock, socket.SOCK_STREAM)
        wait_for("php-fpm to listen", up)

    def logs(self):
        text = ""
        for name in ("fpm.out", "fpm.log"):
            p = self.tmp / name
            if p.exists():
                text += p.read_text()[-4000:]
        return text

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(15)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def requests(fpm, script, n):
    """n concurrent requests through cgi-fcgi; returns their JSON answers."""
    env = dict(os.environ, SCRIPT_FILENAME=script, REQUEST_METHOD="GET", QUERY_STRING="",
               SERVER_PROTOCOL="HTTP/1.1", GATEWAY_INTERFACE="CGI/1.1")
    procs = [subprocess.Popen(["cgi-fcgi", "-bind", "-connect", fpm.sock], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(n)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        body = stdout.decode(errors="replace").replace("\r\n", "\n").split("\n\n", 1)
        text = body[1].strip() if len(body) == 2 else ""
        try:
            out.append(json.loads(text))
        except ValueError:
            fail(f"bad answer from php-fpm: {stdout!r} {stderr!r}\n{fpm.logs()}")
    return out


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

    def dep(self):
        status = self.json("status")
        deps = status["dependencies"]
        if len(deps) != 1 or deps[0]["name"] != "downstream":
            fail(f"expected one dependency 'downstream', got {[d['name'] for d in deps]}")
        return deps[0]


def cmd_server(args):
    ext = extension(args)
    with tempfile.TemporaryDirectory(prefix="retryd-php-fpm-") as tmp:
        daemon = Daemon(args.daemon, tmp, {"downstream": SERVER_DEP})
        downstream = Downstream(tmp, free_port())
        fpm = None
        try:
            downstream.start()
            fpm = Fpm(tmp, ext, {
                "RETRYD_SOCKET": daemon.sock,
                "RETRYD_PHP_SRC": str(BINDING / "src"),
                "DOWNSTREAM_URL": f"http://127.0.0.1:{downstream.port}/ok.txt",
            })
            run_server_test(fpm, Ctl(args.retryctl, daemon.sock), downstream,
                            str(HERE / "fpm_app.php"))
        except SystemExit:
            if fpm:
                log("--- php-fpm log\n" + fpm.logs())
            log("--- retryd log\n" + daemon.log_path.read_text()[-4000:])
            raise
        finally:
            if fpm:
                fpm.stop()
            downstream.close()
            daemon.stop()
    log("php_fpm_server_test: 1 passed, 0 failed")


def run_server_test(fpm, ctl, downstream, script):
    answers = []   # every answer of every request, to sum against the host's counters
    batch = 2 * CHILDREN

    # 1. Downstream up: requests through every child succeed.
    pids = set()

    def all_children_served():
        got = requests(fpm, script, batch)
        answers.extend(got)
        for a in got:
            if a["status"] != 200:
                fail(f"request failed while the downstream is up: {a}")
            pids.add(a["pid"])
        return len(pids) >= CHILDREN
    wait_for(f"requests served by {CHILDREN} php-fpm children", all_children_served,
             interval=0)
    log(f"up: {len(answers)} requests succeeded, served by children {sorted(pids)}")

    workers = ctl.json("workers")["workers"]
    live = {w["pid"] for w in workers if w["state"] == "live"}
    if not pids <= live:
        fail(f"retryctl workers lists {sorted(live)}, not every child of {sorted(pids)}")
    log(f"retryctl workers: the {len(pids)} children are {len(pids)} live processes "
        f"({len(workers)} attached)")
    attached = {w["pid"]: (w["slot"], w["attach_unix_ms"]) for w in workers if w["pid"] in pids}

    # 2. Downstream stopped: failures from every child open one host-wide breaker.
    downstream.stop()
    failing_pids = set()

    def opened():
        got = requests(fpm, script, batch)
        answers.extend(got)
        for a in got:
            if a["status"] == 200:
                fail(f"a request succeeded with the downstream stopped: {a}")
            if a["sent"] > 0:
                failing_pids.add(a["pid"])
        return ctl.dep()["breaker"]["state"] == "open"
    wait_for("the breaker to open", opened, interval=0)
    dep = ctl.dep()
    log(f"down: breaker open after {len(answers)} requests in all; failures sent by children "
        f"{sorted(failing_pids)}")

    # Every child is refused by that one breaker, without sending anything.
    refused = set()

    def every_child_refused():
        got = requests(fpm, script, batch)
        answers.extend(got)
        for a in got:
            if a["rejected"] is not None and a["sent"] == 0:
                refused.add(a["pid"])
        return refused >= pids
    wait_for("every child to be refused by the open breaker", every_child_refused, interval=0)
    log(f"open: children {sorted(refused)} refused ({', '.join(sorted({a['rejected'] for a in answers if a['rejected']}))})")

    # The host's counters are the sum of every child's calls, but for the attempts a child made
    # on per-process limits (its attach unanswered within 20 ms on a loaded machine: it decides
    # alone until the daemon answers), which only that child counted.
    dep = ctl.dep()
    c = dep["counters"]
    sent = sum(a["sent"] for a in answers)
    sent_local = sum(a["sent_local"] for a in answers)
    if sent_local:
        log(f"{sent_local} attempts were made on per-process limits (a child's attach unanswered "
            f"within 20 ms), not counted by the host")
    sent -= sent_local
    completed = c["successes"] + c["failures"] + c["ignored"]
    if sent != completed:
        fail(f"children sent {sent} attempts on host-wide limits, the host counted {completed} ({c})")
    per_child = collections.Counter()
    for a in answers:
        per_child[a["pid"]] += a["sent"] - a["sent_local"]
    if any(per_child[p] == 0 for p in pids):
        fail(f"a child sent nothing: {dict(per_child)}")
    log(f"counters: {sent} attempts from {len(per_child)} children "
        f"({dict(per_child)}) = successes {c['successes']} + failures {c['failures']} + "
        f"ignored {c['ignored']}; {len(answers)} requests, first_attempts {c['first_attempts']}, "
        f"retries granted {c['retries_granted']} denied {c['retries_denied']}, rejected_open "
        f"{c['rejected_open']}, rejected_half_open_busy {c['rejected_half_open_busy']}")
    # Each request whose first attempt was admitted sent it; every other attempt sent was a
    # granted retry.
    admitted_first = sum(1 for a in answers if a["sent"] > 0 and not a["first_local"])
    if c["first_attempts"] != admitted_first:
        fail(f"first_attempts {c['first_attempts']}, but {admitted_first} requests sent one")
    if c["first_attempts"] + c["retries_granted"] != sent:
        fail(f"first_attempts {c['first_attempts']} + retries_granted {c['retries_granted']} "
             f"!= {sent} attempts sent")
    refused_first = sum(1 for a in answers if a["rejected"] is not None and not a["local"])
    if c["rejected_open"] + c["rejected_half_open_busy"] < refused_first:
        fail(f"{refused_first} requests refused, the host counted fewer rejections")

    # 3. Before the downstream returns, no probe is out and the breaker is open (a probe that
    # went out meanwhile has failed and reopened it); from here no request is sent until the
    # downstream answers again.
    dep = wait_for("the breaker open with no probe in flight",
                   lambda: (lambda d: d if d["breaker"]["state"] == "open"
                            and d["breaker"]["probes_in_flight"] == 0 else None)(ctl.dep()))
    probes_before = dep["counters"]["probes_granted"]
    closed_before = dep["counters"]["closed"]
    allowed = dep["policy"]["half_open_probes"]
    downstream.start()

    def closed():
        got = requests(fpm, script, CHILDREN)
        answers.extend(got)
        return ctl.dep()["breaker"]["state"] == "closed"
    wait_for("the breaker to close", closed, interval=0)
    dep = ctl.dep()
    probes = dep["counters"]["probes_granted"] - probes_before
    if probes != allowed:
        fail(f"{probes} probes granted between open and closed, expected exactly "
             f"half_open_probes = {allowed}")
    if dep["counters"]["closed"] != closed_before + 1:
        fail(f"closed {closed_before} -> {dep['counters']['closed']}, expected one close")
    log(f"recovered: breaker closed with exactly {probes} probe (half_open_probes = {allowed}, "
        f"close_after = {dep['policy']['close_after']})")

    # And every child is served again.
    served = set()

    def all_served_again():
        for a in requests(fpm, script, batch):
            if a["status"] == 200:
                served.add(a["pid"])
        return served >= pids
    wait_for("every child to succeed again", all_served_again, interval=0)
    log(f"closed: children {sorted(served)} succeed again")

    # Each child attached once, on its first request, and kept that client: the same
    # registration (slot, attach time) after every later request.
    workers = ctl.json("workers")["workers"]
    now = {w["pid"]: (w["slot"], w["attach_unix_ms"]) for w in workers if w["pid"] in pids}
    if now != attached or len([w for w in workers if w["pid"] in pids]) != len(pids):
        fail(f"children re-attached: {attached} then {now}")
    log(f"per process: each of the {len(pids)} children kept its one registration across "
        f"{len(answers)} requests")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("step", choices=["loads", "constants", "unit", "server"])
    p.add_argument("--ext-dir", required=True)
    p.add_argument("--include", default=str(ROOT / "client" / "include"))
    p.add_argument("--daemon")
    p.add_argument("--retryctl")
    args = p.parse_args()
    {"loads": cmd_loads, "constants": cmd_constants, "unit": cmd_unit,
     "server": cmd_server}[args.step](args)


if __name__ == "__main__":
    main()
