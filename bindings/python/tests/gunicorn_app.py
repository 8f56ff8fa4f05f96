"""The WSGI app test_gunicorn.py serves with gunicorn: each request admits through one
dependency of the segment $RETRYD_SEGMENT and answers JSON with the worker's pid and how the
admission went.

The Client is made at import: in the master with --preload (every worker then inherits it),
else in each worker.

    /ok?sleep=S      admit on "backend", succeed after S seconds
    /fail?sleep=S    admit on "breaker", fail after S seconds (or say why it was refused)
    /retry           dep.call on "budget" with an attempt that always gets a 503: retried while
                     the host's retry budget pays for it
    /hold?hold=0|1   admit on "slow" (bulkhead of 1); with hold=1, write $APP_HOLD_DIR/hold-PID
                     and keep the lease until $APP_HOLD_DIR/release exists
    /probe           GET $APP_DOWNSTREAM/probe through "probe" with requests on retryd's adapter,
                     one attempt per call
"""

import json
import os
import time
import urllib.parse

import retryd
from app_lease import hold_lease

client = retryd.Client(segment=os.environ["RETRYD_SEGMENT"], fallback_to_local=False)
HOLD_DIR = os.environ["APP_HOLD_DIR"]
DOWNSTREAM = os.environ.get("APP_DOWNSTREAM", "")
_session = None


def _probe():
    global _session
    import requests
    if _session is None:
        _session = requests.Session()
        _session.trust_env = False
        _session.mount(DOWNSTREAM, retryd.adapters.RequestsAdapter(
            client.dependency("probe"), retryd.Policy(max_attempts=1, deadline=30.0)))
    try:
        response = _session.get(DOWNSTREAM + "probe", timeout=30)
        return {"outcome": "success" if response.status_code == 200 else "failure"}
    except retryd.Rejected as e:
        return {"outcome": e.reason}


def _admit(dep_name, sleep, fail):
    try:
        with client.dependency(dep_name).admit() as permit:
            time.sleep(sleep)
            if fail:
                permit.fail()
        return {"outcome": "failure" if fail else "success"}
    except retryd.Rejected as e:
        return {"outcome": e.reason}


def _retry():
    policy = retryd.Policy(max_attempts=10, base=0.001, cap=0.001, deadline=30.0)
    try:
        client.dependency("budget").call(lambda attempt: retryd.AttemptResult(status=503),
                                         policy)
        return {"stop": "success"}
    except retryd.CallFailed as e:
        return {"stop": e.result.stop, "attempts": e.result.attempts}
    except retryd.Rejected as e:
        return {"stop": e.reason, "attempts": e.result.attempts}


def app(environ, start_response):
    query = urllib.parse.parse_qs(environ.get("QUERY_STRING", ""))
    sleep = float(query.get("sleep", ["0"])[0])
    path = environ.get("PATH_INFO", "")
    if path == "/ok":
        body = _admit("backend", sleep, fail=False)
    elif path == "/fail":
        body = _admit("breaker", sleep, fail=True)
    elif path == "/retry":
        body = _retry()
    elif path == "/hold":
        body = hold_lease(client, HOLD_DIR, query.get("hold", ["1"])[0] == "1")
    elif path == "/probe":
        body = _probe()
    else:
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found\n"]
    body["pid"] = os.getpid()
    data = json.dumps(body).encode()
    start_response("200 OK", [("Content-Type", "application/json"),
                              ("Content-Length", str(len(data)))])
    return [data]
