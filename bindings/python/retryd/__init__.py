"""retryd: host-wide retry budgets and circuit breakers for Python workers.

A binding of libretryd's C ABI over ctypes, whose hot path (dep.admit() and its Permit) is a C
extension, retryd._speedups, where it is built. Each worker process opens a Client; every
attempt of every call to a downstream dependency is admitted by the host's shared segment and
reported back to it, so that the limits hold for all the workers on the host together:

    import retryd

    client = retryd.Client()                  # the host's segment, or per-process fallback
    orders = client.dependency("orders")

    try:
        with orders.admit() as permit:        # raises retryd.Rejected when not admitted
            response = session.get(url, timeout=1.0)
            if 400 <= response.status_code < 500:
                permit.ignored()              # the caller's fault: not the breaker's business
    except retryd.Rejected as e:
        response = fallback(e.reason)

    # The whole retry loop: backoff with jitter, Retry-After, deadline, classification.
    response = orders.call(lambda attempt: session.get(url, timeout=attempt.timeout),
                           retryd.Policy(max_attempts=3, deadline=2.0))

    @orders.retry(deadline=2.0, method="POST", idempotency_key=True)
    def create(order):
        return session.post(url, json=order, timeout=retryd.current_attempt().timeout)

HTTP clients: retryd.adapters has a requests transport adapter, an httpx transport and a urllib3
PoolManager that run each request through a dependency's retry loop:

    session.mount("https://orders/", retryd.adapters.RequestsAdapter(orders, policy))

The library is found through $RETRYD_LIBRARY, then ctypes.util.find_library("retryd"), then
next to this package and in the source tree's build directories. RETRYD_PYTHON_PURE=1 runs the
ctypes Permit even where the C one is built.

Thread safety: Client, Dependency and the calls are thread-safe; a Permit belongs to one
attempt. Fork safety: a child created by os.fork() or multiprocessing (fork start method)
keeps using the parent's Client; the library registers the child as a process of its own.
"""

from . import adapters
from ._client import (
    AttemptInfo, CallFailed, CallResult, Client, ClientError, Dependency, Env, Error, Permit,
    Rejected, Subscription)
from ._native import LibraryNotFound, library_path
from ._policy import (
    Attempt, AttemptResult, Classifier, Policy, current_attempt, default_classify_exception,
    default_inspect)

__all__ = [
    "adapters", "Attempt", "AttemptInfo", "AttemptResult", "CallFailed", "CallResult",
    "Classifier", "Client", "ClientError", "Dependency", "Env", "Error", "LibraryNotFound",
    "Permit", "Policy", "Rejected", "current_attempt", "default_classify_exception",
    "default_inspect", "library_path", "Subscription",
]
