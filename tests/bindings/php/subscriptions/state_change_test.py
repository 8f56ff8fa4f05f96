#!/usr/bin/env python3
"""The PHP binding's state-change subscriptions attacked in a real php-fpm pool
of ONE child (so consecutive requests meet the same process), against a real retryd:

  1. a subscription made in one request never fires in the next request of the same child,
     nor does one made from inside a callback; a permit left unfinished at the end of a
     request is given back (the bulkhead of one is free in the next request);
  2. exit() inside a subscriber ends the request; it must not crash the child;
  3. on the command line (cli_subscriber_exit.php): exit() inside a subscriber, from a
     completion and from Dependency::call, exits with its status (no crash); exit() inside an
     attempt exits with its status; a fatal error (E_USER_ERROR, memory exhausted) inside a
     subscriber during Dependency::call ends the call: no attempt runs after it, no crash.

  state_change_test.py --ext-dir DIR --daemon FILE

Exits 1 naming the first broken promise."""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import php_binding_test as pbt  # noqa: E402

PREFIX = f"subs{os.getpid()}"
DEPS = {
    f"{PREFIX}_a": {"min_calls": 2, "failure_rate_threshold": 50, "open_for": "1s",
                    "open_for_max": "1s", "open_jitter": "0s", "close_after": 1,
                    "probe_timeout": "60s"},
    f"{PREFIX}_x": {"min_calls": 2, "failure_rate_threshold": 50, "open_for": "60s",
                    "open_for_max": "60s"},
    f"{PREFIX}_bh": {"bulkhead_limit": 1, "bulkhead_timeout": "24h"},
}
CLI_DEP = {"min_calls": 2, "failure_rate_threshold": 50, "open_for": "1s", "open_for_max": "1s",
           "open_jitter": "0s", "close_after": 1, "probe_timeout": "60s"}
CLI_CASES = ["exit-at-completion", "exit-in-call", "exit-in-attempt", "fatal-in-call",
             "oom-in-call"]
for case in CLI_CASES:
    DEPS[f"{PREFIX}_{case.replace('-', '_')}"] = CLI_DEP


def cli_case(ext, sock, case):
    """Runs one case of cli_subscriber_exit.php; returns what went wrong, or None."""
    env = dict(os.environ, RETRYD_SOCKET=sock, SUBSCRIBER_CASE=case,
               SUBSCRIBER_DEP=f"{PREFIX}_{case.replace('-', '_')}")
    r = subprocess.run(["php", "-d", f"extension={ext}", "-d", "memory_limit=32M",
                        "-d", "display_errors=stderr", str(HERE / "cli_subscriber_exit.php")],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=120)
    out = r.stdout
    pbt.log(f"{case}: exit {r.returncode}; stdout {out.strip()!r}; stderr "
            f"{r.stderr.strip()[:200]!r}")
    if r.returncode < 0 or r.returncode == 139:
        return f"{case}: php died of signal {-r.returncode if r.returncode < 0 else 11}"
    if case.startswith("exit"):
        if "AFTER" in out:
            return f"{case}: the script went on after exit()"
        if r.returncode != 3:
            return f"{case}: exit(3) ended php with status {r.returncode}"
    else:
        ran = [l for l in out.splitlines() if l.startswith("attempt ")]
        if len(ran) > 1:
            return (f"{case}: {len(ran) - 1} attempt(s) ran after the fatal error in the "
                    f"subscriber: {ran}")
    return None


def request(fpm, query):
    env = dict(os.environ, SCRIPT_FILENAME=str(HERE / "fpm_subscriptions.php"), REQUEST_METHOD="GET",
               QUERY_STRING=query, SERVER_PROTOCOL="HTTP/1.1", GATEWAY_INTERFACE="CGI/1.1")
    p = subprocess.run(["cgi-fcgi", "-bind", "-connect", fpm.sock], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    body = p.stdout.decode(errors="replace").replace("\r\n", "\n").split("\n\n", 1)
    text = body[1].strip() if len(body) == 2 else ""
    try:
        return json.loads(text)
    except ValueError:
        return {"raw": p.stdout.decode(errors="replace"), "stderr": p.stderr.decode()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ext-dir", required=True)
    ap.add_argument("--daemon", required=True)
    args = ap.parse_args()
    ext = pbt.extension(args)
    pbt.CHILDREN = 1
    failures = []
    with tempfile.TemporaryDirectory(prefix="retryd-php-subscriptions-") as tmp:
        daemon = pbt.Daemon(args.daemon, tmp, DEPS)
        fpm = None
        try:
            fpm = pbt.Fpm(tmp, ext, {"RETRYD_SOCKET": daemon.sock, "SUBSCRIBER_DIR": tmp,
                                     "SUBSCRIBER_DEP_PREFIX": PREFIX})
            fired = pathlib.Path(tmp) / "fired"
            first = request(fpm, "step=subscribe&dep=a")
            pbt.log(f"request 1: {first}")
            if first.get("seen") != ["closed->open"]:
                failures.append(f"request 1's subscriber saw {first.get('seen')}")
            before = fired.read_text() if fired.exists() else ""
            second = request(fpm, "step=next&dep=a")
            after = fired.read_text() if fired.exists() else ""
            pbt.log(f"request 2: {second}; subscribers' file grew by {after[len(before):]!r}")
            if second.get("pid") != first.get("pid"):
                failures.append("the pool's one child changed between the requests")
            if after != before:
                failures.append(f"request 1's subscriptions fired in request 2: "
                                f"{after[len(before):]!r}")
            if second.get("state") != "closed":
                failures.append(f"request 2 left the breaker {second.get('state')}")
            if second.get("lease") != "free":
                failures.append(f"the permit left unfinished in request 1 still holds the "
                                f"bulkhead: {second.get('lease')}")

            third = request(fpm, "step=exit&dep=x")
            fourth = request(fpm, "step=next&dep=a")
            logs = fpm.logs()
            crashed = "SIGSEGV" in logs or "signal 11" in logs
            pbt.log(f"exit() in a subscriber: {third}; next request {fourth}; child crashed: "
                    f"{crashed}")
            if crashed:
                failures.append("exit() inside a subscriber crashed the php-fpm child (SIGSEGV): "
                                + [l for l in logs.splitlines() if "SIGSEGV" in l or "signal 11" in l][0])
            for case in CLI_CASES:
                err = cli_case(ext, daemon.sock, case)
                if err:
                    failures.append(err)
        finally:
            if fpm is not None:
                fpm.stop()
            daemon.stop()
    for f in failures:
        pbt.log("FAIL: " + f)
    pbt.log(f"state-change subscriptions: {'0 failed' if not failures else f'{len(failures)} failed'}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
