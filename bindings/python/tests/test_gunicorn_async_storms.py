"""The asyncio servers under gunicorn attacked: FastAPI
under uvicorn workers and aiohttp under aiohttp workers, four workers, the real daemon.

A failing test here is a broken promise: its docstring says which one.

- exactly one probe reaches a recovered downstream when many clients (STORM_THREADS threads, looping: 16, or $RETRYD_STORM_THREADS)
  hammer every worker across the end of the open period;
- exactly one probe reaches it when the clients that hold the probe give up (close their
  connection) while the probe is still out downstream;
- a worker SIGKILLed while it awaits its probe's answer gives the probe back.
"""

import http.client
import os
import signal
import socket
import struct
import threading
import time

import pytest

import retryd
from conftest import dependency_status, retryctl_path
from test_adapters import Reply, Server
from test_gunicorn import TIMEOUT, VARIANTS, Gunicorn, _binary, _gunicorn, poll, registered

ASYNC_VARIANTS = ["aiohttp", "fastapi-uvicorn"]
# Clients looping on /probe at once; more on demand (RETRYD_STORM_THREADS=48).
STORM_THREADS = int(os.environ.get("RETRYD_STORM_THREADS", "16"))


@pytest.fixture(scope="module", params=ASYNC_VARIANTS)
def served(request, tmp_path_factory):
    daemon_binary = _binary("RETRYD_DAEMON", "daemon/retryd")
    gunicorn = _gunicorn()
    if daemon_binary is None or retryctl_path() is None or gunicorn is None:
        pytest.skip("retryd, retryctl or gunicorn missing")
    pytest.importorskip(VARIANTS[request.param].module)
    downstream = Server()
    downstream.listen()
    g = Gunicorn(request.param, tmp_path_factory.mktemp(f"adv-{request.param}"), downstream)
    try:
        g.start(daemon_binary, gunicorn)
        yield g
    finally:
        g.stop()
        downstream.close()


def trip(served):
    """Trips "probe" (the downstream failing) and returns how many requests reached it."""
    downstream = served.downstream
    downstream.script("/probe", Reply(500, b"down"))
    served.spread("/probe", lambda a: any(x["outcome"] == "open" for x in a),
                  "the workers to trip the breaker")
    poll(lambda: dependency_status(served.segment, "probe")["breaker"]["state"] == "open",
         "the breaker to open")
    return len(downstream.requests_to("/probe"))


def try_get(served, path, timeout=TIMEOUT):
    try:
        return served.get(path, timeout=timeout)
    except (OSError, http.client.HTTPException, AssertionError) as e:
        return {"outcome": f"error {type(e).__name__}"}


def test_exactly_one_probe_under_a_storm_across_the_half_open(served):
    """Promise 4: exactly one probe reaches the recovered downstream while every other request
    is refused half-open busy: STORM_THREADS client threads loop on /probe over all four workers from
    before the open period ends until the probe has answered."""
    hold = 3.0
    tripped = trip(served)
    downstream = served.downstream
    # Every answer held: a second request let through while the probe is out is seen.
    downstream.script("/probe", Reply(200, b"up", delay=hold))
    stop = threading.Event()
    answers = []
    lock = threading.Lock()

    def hammer():
        while not stop.is_set():
            a = try_get(served, "/probe")
            with lock:
                answers.append((a, time.monotonic()))

    threads = [threading.Thread(target=hammer, daemon=True) for _ in range(STORM_THREADS)]
    for t in threads:
        t.start()
    poll(lambda: len(downstream.requests_to("/probe")) > tripped, "the probe to arrive",
         timeout=TIMEOUT)
    probe_at = downstream.requests_to("/probe")[tripped]["time"]
    poll(lambda: time.monotonic() > probe_at + hold + 0.5, "the probe's answer")
    stop.set()
    for t in threads:
        t.join(TIMEOUT)
    arrived = downstream.requests_to("/probe")[tripped:]
    during = [r for r in arrived if r["time"] < probe_at + hold - 0.05]
    outcomes = {}
    for a, _ in answers:
        outcomes[a["outcome"]] = outcomes.get(a["outcome"], 0) + 1
    print(f"{served.variant}: {len(answers)} answers {outcomes}; {len(during)} request(s) "
          f"reached the downstream while the probe was out")
    assert len(during) == 1, f"{len(during)} requests reached the downstream in half-open"


def test_exactly_one_probe_when_the_probes_clients_give_up(served):
    """Promise 4 (with promise 2's "a cancelled probe is given back"): the client whose request
    carries the probe closes its connection while the probe is out downstream (a proxy's
    timeout, an impatient user). If the server cancels the handler, the probe goes back
    unjudged while its request is still at the downstream, and the next request is a second
    probe: more than one request reaches the recovering downstream at once."""
    hold = 5.0
    tripped = trip(served)
    downstream = served.downstream
    downstream.script("/probe", Reply(200, b"up", delay=hold))
    poll(lambda: dependency_status(served.segment, "probe")["breaker"]["half_open_in_ms"] == 0,
         "the open period to end")
    started = time.monotonic()
    gave_up = 0
    for _ in range(5):
        seen = len(downstream.requests_to("/probe"))
        s = socket.create_connection(("127.0.0.1", served.port))
        s.sendall(b"GET /probe HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        # Wait until this request has reached the downstream, or is answered (refused).
        s.settimeout(0.5)
        try:
            answered = s.recv(4096)
        except socket.timeout:
            answered = b""
        if not answered and len(downstream.requests_to("/probe")) > seen:
            gave_up += 1
        # The client gives up: a reset, as a proxy that times out may send.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
        time.sleep(0.2)
        if time.monotonic() - started > hold - 1.0:
            break
    arrived = downstream.requests_to("/probe")[tripped:]
    first = arrived[0]["time"] if arrived else 0
    during = [r for r in arrived if r["time"] < first + hold - 0.05]
    status = dependency_status(served.segment, "probe")
    print(f"{served.variant}: {gave_up} clients gave up; {len(during)} request(s) reached the "
          f"downstream within {hold}s of the first probe; breaker {status['breaker']}")
    assert len(during) == 1, (f"{len(during)} probes reached the recovering downstream at once "
                              f"({served.variant}: a disconnected client's probe was given back "
                              f"while its request was still out)")
    # Let the held answers finish before the next test.
    poll(lambda: time.monotonic() > first + hold + 0.5, "the held answers")


def test_a_worker_killed_while_it_awaits_its_probe_gives_the_probe_back(served):
    """Promise 4: a SIGKILLed worker's lease comes back; here the probe, killed mid-await."""
    hold = 30.0
    tripped = trip(served)
    downstream = served.downstream
    downstream.script("/probe", Reply(200, b"up", delay=hold), Reply(200, b"up"))
    poll(lambda: dependency_status(served.segment, "probe")["breaker"]["half_open_in_ms"] == 0,
         "the open period to end")
    thread = threading.Thread(target=lambda: try_get(served, "/probe"), daemon=True)
    thread.start()
    poll(lambda: len(downstream.requests_to("/probe")) > tripped, "the probe to arrive")
    holder = poll(lambda: next((pid for pid, w in registered(served.segment).items()
                                if w.get("probe_leases")), None), "the probe's holder")
    assert dependency_status(served.segment, "probe")["breaker"]["probes_in_flight"] == 1
    os.kill(holder, signal.SIGKILL)
    poll(lambda: dependency_status(served.segment, "probe")["breaker"]["probes_in_flight"] == 0,
         "the daemon to take the dead worker's probe back")
    served.workers()  # gunicorn has replaced it
    answer = poll(lambda: (lambda a: a if a["outcome"] in ("success", "failure") else None)(
        try_get(served, "/probe")), "a new probe to go out")
    assert answer["outcome"] == "success"
    status = dependency_status(served.segment, "probe")
    print(f"{served.variant}: after the kill: {status['breaker']}, "
          f"reclaimed {status['counters']['leases_reclaimed_dead']}")
    assert status["breaker"]["state"] == "closed"
    downstream.release.set()
    thread.join(TIMEOUT)
    downstream.release.clear()
