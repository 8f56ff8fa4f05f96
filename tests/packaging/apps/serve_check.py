#!/usr/bin/python3
"""serve_check.py: drives one of in_root.sh's servers and checks through retryctl that the
daemon counted what it served.

Usage:
  serve_check.py puma SOCKET MASTER_PID WORKERS DEPENDENCY
  serve_check.py fpm SOCKET SCRIPT MASTER_PID WORKERS DEPENDENCY
  serve_check.py nginx HOST:PORT MASTER_PID WORKERS DEPENDENCY

Sends one request, then rounds of 2 x WORKERS concurrent requests (HTTP over Puma's Unix
socket or to nginx's port, or FastCGI through cgi-fcgi to php-fpm's) until WORKERS different
processes have answered, at most 10 rounds. Every answer must come from a child of MASTER_PID
whose client is attached to the daemon (not on per-process limits). Then `retryctl status
--json DEPENDENCY` must count exactly one first attempt and one success per request, and
`retryctl workers --json` must list every process that answered as connected through the
socket. Prints what it saw; exits 1 on the first check that fails, saying which."""
import http.client
import json
import os
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

ROUNDS = 10


def fail(msg):
    print(f"serve_check.py: {msg}", file=sys.stderr)
    sys.exit(1)


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=60)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(60)
        self.sock.connect(self.path)


def puma_request(sock):
    conn = UnixHTTPConnection(sock)
    try:
        conn.request("GET", "/")
        res = conn.getresponse()
        body = res.read().decode(errors="replace")
    finally:
        conn.close()
    if res.status != 200:
        fail(f"Puma answered {res.status}: {body}")
    return body


def nginx_request(address):
    host, _, port = address.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("GET", "/", headers={"Connection": "close"})
        res = conn.getresponse()
        body = res.read().decode(errors="replace")
    finally:
        conn.close()
    if res.status != 200:
        fail(f"nginx answered {res.status}: {body}")
    return body


def fpm_request(sock, script):
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SCRIPT_FILENAME": script,
           "REQUEST_METHOD": "GET", "QUERY_STRING": "", "SERVER_PROTOCOL": "HTTP/1.1",
           "GATEWAY_INTERFACE": "CGI/1.1"}
    r = subprocess.run(["cgi-fcgi", "-bind", "-connect", sock], env=env, capture_output=True,
                       timeout=60)
    text = r.stdout.decode(errors="replace").replace("\r\n", "\n")
    head, _, body = text.partition("\n\n")
    if r.returncode != 0 or "Status:" in head:
        fail(f"php-fpm answered {text!r} (cgi-fcgi exit {r.returncode}, {r.stderr!r})")
    return body


def retryctl(*args):
    r = subprocess.run(["retryctl", *args], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        fail(f"retryctl {' '.join(args)} exited {r.returncode}: {r.stderr}")
    return json.loads(r.stdout)


def main(argv):
    if len(argv) == 6 and argv[1] == "puma":
        _, kind, sock, master, workers, dependency = argv
        request = lambda: puma_request(sock)  # noqa: E731
    elif len(argv) == 7 and argv[1] == "fpm":
        _, kind, sock, script, master, workers, dependency = argv
        request = lambda: fpm_request(sock, script)  # noqa: E731
    elif len(argv) == 6 and argv[1] == "nginx":
        _, kind, address, master, workers, dependency = argv
        request = lambda: nginx_request(address)  # noqa: E731
    else:
        fail("usage: serve_check.py puma SOCKET MASTER_PID WORKERS DEPENDENCY | "
             "serve_check.py fpm SOCKET SCRIPT MASTER_PID WORKERS DEPENDENCY | "
             "serve_check.py nginx HOST:PORT MASTER_PID WORKERS DEPENDENCY")
    master, workers = int(master), int(workers)

    # The first request alone: it makes the dependency in the daemon's segment (the packaged
    # config creates a name on its first use). Two processes creating one new name at once
    # would count one call on per-process limits: the second waits at most 1 ms for the
    # first's create lock (docs/INVARIANTS.md), and a loaded machine's first creator can take
    # longer.
    answers = []

    def answer(body):
        try:
            answers.append(json.loads(body))
        except ValueError:
            fail(f"{kind}: not JSON: {body!r}")

    answer(request())
    with ThreadPoolExecutor(max_workers=2 * workers) as pool:
        for _ in range(ROUNDS):
            for body in pool.map(lambda _: request(), range(2 * workers)):
                answer(body)
            if len({a["pid"] for a in answers}) >= workers:
                break
    pids = sorted({a["pid"] for a in answers})
    print(f"{kind}: {len(answers)} requests served by pids {pids} (master {master}); "
          f"first answer {answers[0]}")
    if len(pids) < workers:
        fail(f"{kind}: {ROUNDS} rounds served by {len(pids)} process(es), not {workers}")
    for a in answers:
        if a["ppid"] != master or a["pid"] == master:
            fail(f"{kind}: answered by pid {a['pid']}, not a child of the master {master}: {a}")
        if a["attached"] is not True:
            fail(f"{kind}: pid {a['pid']} is on per-process limits, not attached to the daemon")

    status = retryctl("status", "--json", dependency)
    deps = [d for d in status["dependencies"] if d["name"] == dependency]
    if len(deps) != 1:
        fail(f"retryctl status: no dependency {dependency} in the daemon's segment")
    counters = deps[0]["counters"]
    print(f"retryctl status {dependency}: first_attempts {counters['first_attempts']}, "
          f"successes {counters['successes']}")
    if counters["first_attempts"] != len(answers) or counters["successes"] != len(answers):
        fail(f"retryctl status {dependency}: counted {counters['first_attempts']} first attempts"
             f" and {counters['successes']} successes, not the {len(answers)} requests served")
    connected = {w["pid"] for w in retryctl("workers", "--json")["workers"] if w["connected"]}
    missing = [p for p in pids if p not in connected]
    if missing:
        fail(f"retryctl workers: pids {missing} are not connected processes ({sorted(connected)})")


if __name__ == "__main__":
    main(sys.argv)
