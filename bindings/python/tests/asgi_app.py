"""The FastAPI app test_gunicorn.py serves with gunicorn's uvicorn workers: the endpoints of
async_app_common.py; /probe goes through httpx.AsyncClient on retryd's async transport."""

import os

import fastapi
import httpx

import retryd
from async_app_common import DOWNSTREAM, PROBE_POLICY, admit, client, probe_outcome, retry
from async_app_common import hold as hold_lease

app = fastapi.FastAPI()
_http = None


def _client():
    global _http
    if _http is None:  # made in the worker, on its event loop
        _http = httpx.AsyncClient(
            transport=retryd.adapters.AsyncHTTPXTransport(client.dependency("probe"),
                                                          PROBE_POLICY),
            trust_env=False, timeout=30)
    return _http


def _answer(body):
    body["pid"] = os.getpid()
    return body


@app.get("/ok")
async def ok(sleep: float = 0.0):
    return _answer(await admit("backend", sleep, fail=False))


@app.get("/fail")
async def fail(sleep: float = 0.0):
    return _answer(await admit("breaker", sleep, fail=True))


@app.get("/retry")
async def retry_endpoint():
    return _answer(await retry())


@app.get("/hold")
async def hold_endpoint(hold: str = "1"):
    return _answer(await hold_lease(hold == "1"))


@app.get("/probe")
async def probe():
    try:
        response = await _client().get(DOWNSTREAM + "probe")
        return _answer({"outcome": probe_outcome(response.status_code)})
    except retryd.Rejected as e:
        return _answer({"outcome": e.reason})
