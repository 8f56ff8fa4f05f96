"""The WSGI app test_uwsgi.py serves with uWSGI: each request calls the test's downstream
($APP_DOWNSTREAM/NAME) through one dependency of the segment $RETRYD_SEGMENT, and answers JSON
with the worker's pid and how the call went.

The Client is made at import: in the master without --lazy-apps (every worker forked from it
then inherits it), in each worker with it.

    /breaker?sleep=S   one attempt on "breaker", GET /breaker
    /budget?sleep=S    dep.call on "budget", GET /budget, up to 10 attempts: retried on a 503
                       while the host's retry budget pays for it
    /probe?sleep=S     one attempt on "probe", GET /probe
    /hold?hold=0|1     admit on "slow" (bulkhead of 1); with hold=1, write $APP_HOLD_DIR/hold-PID
                       and keep the lease until $APP_HOLD_DIR/release exists
    /idle?sleep=S      no call: the worker answers after S seconds (it serves, and has its app)

After the call, the worker sleeps S seconds: a busy worker leaves the next connection of a burst
to another.
"""

import json
import os
import time
import urllib.parse
import urllib.request

import retryd
from app_lease import hold_lease

client = retryd.Client(segment=os.environ["RETRYD_SEGMENT"], fallback_to_local=False)
DOWNSTREAM = os.environ["APP_DOWNSTREAM"]
HOLD_DIR = os.environ["APP_HOLD_DIR"]

# The test's downstream is on this machine: no proxy from the environment.
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _get(name):
    def attempt(a):
        with _opener.open(f"{DOWNSTREAM}/{name}", timeout=120) as response:
            response.read()
            return response
    return attempt


def _call(name, policy):
    try:
        client.dependency(name).call(_get(name), policy)
        return {"outcome": "success", "attempts": None}
    except retryd.CallFailed as e:
        return {"outcome": "failure", "stop": e.result.stop, "attempts": e.result.attempts}
    except retryd.Rejected as e:
        # A refused first attempt sent nothing; a refused retry, the attempts before it.
        return {"outcome": e.reason, "attempts": e.result.attempts}


ONE_ATTEMPT = retryd.Policy(max_attempts=1)
RETRIES = retryd.Policy(max_attempts=10, base=0.001, cap=0.001, deadline=60.0)


def application(environ, start_response):
    query = urllib.parse.parse_qs(environ.get("QUERY_STRING", ""))
    sleep = float(query.get("sleep", ["0"])[0])
    path = environ.get("PATH_INFO", "")
    if path in ("/breaker", "/probe", "/budget"):
        body = _call(path[1:], RETRIES if path == "/budget" else ONE_ATTEMPT)
        time.sleep(sleep)
    elif path == "/hold":
        body = hold_lease(client, HOLD_DIR, query.get("hold", ["1"])[0] == "1")
    elif path == "/idle":
        body = {"outcome": "idle"}
        time.sleep(sleep)
    else:
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found\n"]
    body["pid"] = os.getpid()
    data = json.dumps(body).encode()
    start_response("200 OK", [("Content-Type", "application/json"),
                              ("Content-Length", str(len(data)))])
    return [data]
