"""The aiohttp app test_gunicorn.py serves with gunicorn's aiohttp workers: the endpoints of
async_app_common.py; /probe goes through an aiohttp.ClientSession with retryd's AiohttpClient."""

import os

import aiohttp
from aiohttp import web

import retryd
from async_app_common import DOWNSTREAM, PROBE_POLICY, admit, client, hold, probe_outcome, retry

_http = None


def _client():
    global _http
    if _http is None:  # made in the worker, on its event loop
        session = aiohttp.ClientSession(trust_env=False)
        _http = retryd.adapters.AiohttpClient(client.dependency("probe"), PROBE_POLICY, session)
    return _http


def _answer(body):
    body["pid"] = os.getpid()
    return web.json_response(body)


def _sleep(request):
    return float(request.query.get("sleep", "0"))


async def ok(request):
    return _answer(await admit("backend", _sleep(request), fail=False))


async def fail(request):
    return _answer(await admit("breaker", _sleep(request), fail=True))


async def retry_endpoint(request):
    return _answer(await retry())


async def hold_endpoint(request):
    return _answer(await hold(request.query.get("hold", "1") == "1"))


async def probe(request):
    try:
        response = await _client().get(DOWNSTREAM + "probe")
        return _answer({"outcome": probe_outcome(response.status)})
    except retryd.Rejected as e:
        return _answer({"outcome": e.reason})


app = web.Application()
app.add_routes([web.get("/ok", ok), web.get("/fail", fail), web.get("/retry", retry_endpoint),
                web.get("/hold", hold_endpoint), web.get("/probe", probe)])
