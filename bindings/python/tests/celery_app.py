"""The Celery app test_celery.py runs in a prefork worker: tasks that call the test's
downstream ($APP_DOWNSTREAM/NAME) through retryd.celery.Task, on the segment $RETRYD_SEGMENT,
with the broker and result backend $APP_BROKER (the test's redis-server).

The Client of "breaker", "budget" and "probe" is made at import, in the worker's main
process, so every pool process forked from it inherits it; "slow" is named, and resolved on
the Client each pool process makes on first use.

    breaker   one attempt, GET /breaker
    budget    up to 10 attempts, GET /budget, retried on a 5xx after the policy's backoff
    probe     one attempt, GET /probe
    hold      admitted on "slow" (bulkhead of 1): with hold=True, writes $APP_HOLD_DIR/hold-PID
              and keeps the lease until $APP_HOLD_DIR/release exists

Every execution is recorded, after it ends, on the Redis list "executions" as JSON: task id,
task name, pool process pid, attempt number (self.request.retries), Celery's state, and the
refusal's reason, the retry's countdown or the error's type, and the message's ETA and
retryd.celery.BACKOFF_HEADER (a retry's: the backoff before it). Each execution takes at least
SPREAD seconds, so that a burst of tasks spreads over the pool's processes.
"""

import json
import os
import time
import urllib.request

import celery
import redis
from celery import signals

import retryd
import retryd.celery

SPREAD = 0.02

client = retryd.Client(segment=os.environ["RETRYD_SEGMENT"], fallback_to_local=False)
DOWNSTREAM = os.environ["APP_DOWNSTREAM"]
HOLD_DIR = os.environ["APP_HOLD_DIR"]

app = celery.Celery("celery_app", broker=os.environ["APP_BROKER"],
                    backend=os.environ["APP_BROKER"])
app.conf.update(
    task_serializer="json", result_serializer="json", accept_content=["json"],
    worker_prefetch_multiplier=1, broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False)

# The test's downstream is on this machine: no proxy from the environment.
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _get(name):
    with _opener.open(f"{DOWNSTREAM}/{name}", timeout=120) as response:
        return response.read().decode().strip()


@app.task(bind=True, base=retryd.celery.Task, retryd_dependency=client.dependency("breaker"),
          retryd_policy=retryd.Policy(max_attempts=1))
def breaker(self):
    return _get("breaker")


@app.task(bind=True, base=retryd.celery.Task, retryd_dependency=client.dependency("budget"),
          retryd_policy=retryd.Policy(max_attempts=10, jitter="equal", base=0.02, cap=0.08))
def budget(self):
    return _get("budget")


@app.task(bind=True, base=retryd.celery.Task, retryd_dependency=client.dependency("probe"),
          retryd_policy=retryd.Policy(max_attempts=1))
def probe(self):
    return _get("probe")


@app.task(bind=True, base=retryd.celery.Task, retryd_dependency="slow",
          retryd_policy=retryd.Policy(max_attempts=1))
def hold(self, hold):
    if hold:
        partial = os.path.join(HOLD_DIR, f".partial-{os.getpid()}")
        with open(partial, "w") as f:
            f.write(str(os.getpid()))
        # Renamed into place, so the test reads it whole or not at all.
        os.rename(partial, os.path.join(HOLD_DIR, f"hold-{os.getpid()}"))
        end = time.monotonic() + 300
        while not os.path.exists(os.path.join(HOLD_DIR, "release")):
            if time.monotonic() > end:
                break
            time.sleep(0.05)
    return "held" if hold else "passed"


_redis = None


@signals.task_prerun.connect
def _spread(**_):
    time.sleep(SPREAD)


@signals.task_postrun.connect
def _record(task_id, task, retval, state, **_):
    global _redis
    entry = {"id": task_id, "task": task.name.rsplit(".", 1)[-1], "pid": os.getpid(),
             "attempt": task.request.retries, "state": state, "eta": task.request.eta,
             "backoff_ns": getattr(task.request, retryd.celery.BACKOFF_HEADER, None)}
    if isinstance(retval, retryd.Rejected):
        entry["rejected"] = retval.reason
    elif isinstance(retval, celery.exceptions.Retry):
        entry["countdown"] = retval.when
    elif isinstance(retval, BaseException):
        entry["error"] = type(retval).__name__
    if _redis is None:
        _redis = redis.Redis.from_url(os.environ["APP_BROKER"].replace("redis+socket://",
                                                                       "unix://"))
    _redis.rpush("executions", json.dumps(entry))
