"""What the Celery and uWSGI tests share: the real daemon on a private segment, a downstream
HTTP server the test controls and counts requests at, and polling.

The downstream serves GET /NAME for any dependency NAME: it answers each path's current
status (200 until told otherwise), counts every request it receives per path, and, for a
path told to hold, keeps each request open until the test releases it.

The machine may be loaded: every condition is polled, with generous timeouts, never slept
for.
"""

import collections
import http.server
import os
import pathlib
import subprocess
import threading
import time

import pytest

from conftest import ROOT, dependency_status, retryctl_json, retryctl_path

TIMEOUT = 60.0  # seconds, for every condition polled

# The dependencies of both tests' daemons. "breaker" trips after 8 calls at 50 % failures and
# stays open; "budget" has four retry tokens for the host and no refill; "probe" trips after 4
# failures and reopens after 1 s, without jitter, for one probe whose success closes it;
# "slow" lets one call at a time through, for as long as it takes.
CONFIG = """\
[daemon]
segment = "{segment}"
socket = ""
mode = "0600"
tick = "10ms"

[dependency.breaker]
min_calls = 8
failure_rate_threshold = 50
window = "1h"
open_for = "1h"
open_for_max = "1h"

[dependency.budget]
min_calls = 100000
retry_burst = 4
retry_ratio = 0
min_retries_per_sec = 0

[dependency.probe]
min_calls = 4
failure_rate_threshold = 50
window = "1h"
open_for = "1s"
open_for_max = "1s"
open_jitter = "0s"
half_open_probes = 1
close_after = 1
probe_timeout = "1h"

[dependency.slow]
min_calls = 100000
bulkhead_limit = 1
bulkhead_timeout = "1h"
"""


def poll(condition, what, timeout=TIMEOUT, interval=0.05):
    """Returns condition()'s first true value, polling until `timeout`; fails naming `what`."""
    end = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > end:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def daemon_binary():
    path = os.environ.get("RETRYD_DAEMON")
    if path:
        return path
    for found in sorted(ROOT.glob("build*/daemon/retryd")):
        return str(found)
    return None


def children(pid):
    """The live (not zombie) child processes of `pid`."""
    kids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = pathlib.Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            kids.add(int(entry))
    return kids


def registered(segment):
    """{pid: entry} of the live processes `retryctl workers` lists."""
    return {w["pid"]: w for w in retryctl_json(segment, "workers")["workers"]
            if w["state"] == "live"}


def stop_process(proc, timeout=TIMEOUT):
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)


class Daemon:
    """retryd on a segment of its own, with CONFIG."""

    def __init__(self, tmp, segment):
        self.tmp = tmp
        self.segment = segment
        self.proc = None
        self._log = None

    def start(self, binary):
        config = self.tmp / "retryd.toml"
        config.write_text(CONFIG.format(segment=self.segment))
        self._log = open(self.tmp / "retryd.log", "w")
        self.proc = subprocess.Popen([binary, f"--config={config}"], stdout=self._log,
                                     stderr=self._log)
        poll(lambda: self.proc.poll() is not None or self._up(), "the daemon to come up")
        if self.proc.poll() is not None:
            pytest.fail("retryd exited: " + (self.tmp / "retryd.log").read_text())

    def _up(self):
        try:
            return retryctl_json(self.segment, "status")["daemon"]["state"] == "up"
        except (RuntimeError, ValueError):
            return False  # no segment yet

    def dep(self, name):
        return dependency_status(self.segment, name)

    def stop(self):
        stop_process(self.proc)
        # A daemon stopped by SIGTERM leaves its segment for the next one: this one is ours.
        try:
            os.unlink(f"/dev/shm/{self.segment}")
        except FileNotFoundError:
            pass
        if self._log is not None:
            self._log.close()


def require_daemon():
    """Skips the test when the daemon, retryctl or the library is not built."""
    import retryd
    binary = daemon_binary()
    if binary is None:
        pytest.skip("retryd not built")
    if retryctl_path() is None:
        pytest.skip("retryctl not built")
    try:
        retryd.library_path()
    except retryd.LibraryNotFound as e:
        pytest.skip(str(e))
    return binary


class _Path:
    def __init__(self):
        self.status = 200
        self.delay = 0.0
        self.hold = False
        self.count = 0
        self.held = 0


class Downstream:
    """A threaded HTTP server on 127.0.0.1 that counts requests per path. Thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._paths = collections.defaultdict(_Path)
        self._release = threading.Event()
        downstream = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                downstream._serve(self)

            def log_message(self, *args):
                pass

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True
            # Room for every worker's connection while the test's threads hold the GIL (the
            # default backlog is 5).
            request_queue_size = 128

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def _serve(self, handler):
        name = handler.path.lstrip("/").split("?")[0]
        with self._lock:
            path = self._paths[name]
            path.count += 1
            hold, status, delay = path.hold, path.status, path.delay
            if hold:
                path.held += 1
        if hold:
            self._release.wait(TIMEOUT * 2)
        elif delay:
            time.sleep(delay)
        body = f"{name} {status}\n".encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "text/plain")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def set(self, name, status=None, delay=None, hold=None):
        """Sets what /NAME answers from now on; hold=True keeps each request open until
        release()."""
        with self._lock:
            path = self._paths[name]
            if status is not None:
                path.status = status
            if delay is not None:
                path.delay = delay
            if hold is not None:
                path.hold = hold
                if hold:
                    self._release.clear()

    def count(self, name):
        """Requests received on /NAME so far."""
        with self._lock:
            return self._paths[name].count

    def held(self, name):
        """Requests /NAME is holding or has held."""
        with self._lock:
            return self._paths[name].held

    def release(self):
        """Answers every held request, and holds no more."""
        with self._lock:
            for path in self._paths.values():
                path.hold = False
        self._release.set()

    def close(self):
        self.release()
        self.server.shutdown()
        self.server.server_close()
