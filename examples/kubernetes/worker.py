"""The orders worker of examples/kubernetes/retryd.yaml: calls the payments service through the
retry budget and breaker that its node's retryd keeps for every pod of the node.

It calls $PAYMENTS_URL every $INTERVAL_SECONDS (default 1) with the retry loop of
libretryd (at most 3 attempts in 2 s, each at most 0.8 s), and logs each call's outcome: the
response's status, a refusal by the host (the breaker is open, or the host's retry budget is
spent), or the call given up. $CALLS, if set, stops it after that many calls; by default it runs
until it is stopped. retryd.Client() attaches through $RETRYD_SOCKET, the daemon's socket on the
node; while no daemon answers there, it runs on per-process limits and attaches later.
"""

import logging
import os
import time
import urllib.request

import retryd

log = logging.getLogger("orders-worker")


def call_payments(payments, url, policy):
    """One call of the payments service: returns its status, or why it got none."""
    def attempt(a):
        with urllib.request.urlopen(url, timeout=a.timeout) as r:
            r.read()
            return r
    try:
        return f"status {payments.call(attempt, policy).status}"
    except retryd.Rejected as e:
        return f"refused by the host ({e.reason})"
    except retryd.CallFailed as e:
        return f"given up ({e.result.stop}, {e.result.attempts} attempts)"


def main():
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    url = os.environ["PAYMENTS_URL"]
    interval = float(os.environ.get("INTERVAL_SECONDS", "1"))
    calls = int(os.environ.get("CALLS", "0"))
    payments = retryd.Client().dependency("payments")
    policy = retryd.Policy(max_attempts=3, deadline=2.0, attempt_timeout=0.8)
    done = 0
    while calls == 0 or done < calls:
        log.info("payments: %s", call_payments(payments, url, policy))
        done += 1
        if calls == 0 or done < calls:
            time.sleep(interval)


if __name__ == "__main__":
    main()
