"""What asgi_app.py (FastAPI) and aiohttp_app.py serve, in asyncio: the endpoints of
gunicorn_app.py, each admitted through the segment $RETRYD_SEGMENT with the binding's asyncio
API (async with dep.admit(), dep.call_async, and the async HTTP adapters for /probe), answering
JSON with the worker's pid.

    /ok?sleep=S      async with "backend"'s admission, succeed after S seconds
    /fail?sleep=S    async with "breaker"'s admission, fail after S seconds
    /retry           dep.call_async on "budget", every attempt a 503
    /hold?hold=0|1   "slow" (bulkhead of 1), held until $APP_HOLD_DIR/release exists
    /probe           GET $APP_DOWNSTREAM/probe through "probe", one attempt per call
"""

import asyncio
import os

import retryd

client = retryd.Client(segment=os.environ["RETRYD_SEGMENT"], fallback_to_local=False)
HOLD_DIR = os.environ["APP_HOLD_DIR"]
DOWNSTREAM = os.environ.get("APP_DOWNSTREAM", "")
PROBE_POLICY = retryd.Policy(max_attempts=1, deadline=30.0)


async def admit(dep_name, sleep, fail):
    try:
        async with client.dependency(dep_name).admit() as permit:
            await asyncio.sleep(sleep)
            if fail:
                permit.fail()
        return {"outcome": "failure" if fail else "success"}
    except retryd.Rejected as e:
        return {"outcome": e.reason}


async def retry():
    async def always_503(attempt):
        return retryd.AttemptResult(status=503)

    policy = retryd.Policy(max_attempts=10, base=0.001, cap=0.001, deadline=30.0)
    try:
        await client.dependency("budget").call_async(always_503, policy)
        return {"stop": "success"}
    except retryd.CallFailed as e:
        return {"stop": e.result.stop, "attempts": e.result.attempts}
    except retryd.Rejected as e:
        return {"stop": e.reason, "attempts": e.result.attempts}


async def hold(hold_it):
    try:
        async with client.dependency("slow").admit():
            if hold_it:
                partial = os.path.join(HOLD_DIR, f".partial-{os.getpid()}")
                with open(partial, "w") as f:
                    f.write(str(os.getpid()))
                os.rename(partial, os.path.join(HOLD_DIR, f"hold-{os.getpid()}"))
                for _ in range(6000):
                    if os.path.exists(os.path.join(HOLD_DIR, "release")):
                        break
                    await asyncio.sleep(0.05)
        return {"outcome": "success"}
    except retryd.Rejected as e:
        return {"outcome": e.reason}


def probe_outcome(status):
    return "success" if status == 200 else "failure"
