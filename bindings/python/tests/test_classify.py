"""default_classify_exception on what real HTTP clients raise: a refused connection, a failed
name lookup and a timeout are recognised through each client's wrapping of the socket error."""

import socket
import urllib.error
import urllib.request

import pytest

import retryd

classify = retryd.default_classify_exception


@pytest.fixture
def refused_url():
    """A URL on 127.0.0.1 where connecting is refused.

    The port is bound and never listened on, so the kernel answers a connect with a reset
    (ECONNREFUSED) and no other process can take the port while the test runs.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/orders"
    sock.close()


def raised(fn, *args, **kwargs):
    with pytest.raises(Exception) as e:
        fn(*args, **kwargs)
    return e.value


def test_urllib_refused_is_connect_refused(refused_url):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    exc = raised(opener.open, urllib.request.Request(refused_url, data=b"{}", method="POST"),
                 timeout=5)
    assert classify(exc) == "connect_refused", repr(exc)


def test_requests_refused_is_connect_refused(refused_url):
    requests = pytest.importorskip("requests", reason="python3-requests is not installed")
    with requests.Session() as session:
        session.trust_env = False  # no proxy from the environment: connect to the port itself
        exc = raised(session.post, refused_url, json={}, timeout=5)
    assert isinstance(exc, requests.exceptions.ConnectionError)
    assert classify(exc) == "connect_refused", repr(exc)


def test_urllib3_refused_is_connect_refused(refused_url):
    urllib3 = pytest.importorskip("urllib3", reason="python3-urllib3 is not installed")
    with urllib3.PoolManager(retries=False, timeout=5) as pool:
        exc = raised(pool.request, "POST", refused_url, body=b"{}")
    # NewConnectionError is a ConnectTimeoutError in urllib3 1.26: it must not read as a timeout.
    assert isinstance(exc, urllib3.exceptions.NewConnectionError)
    assert classify(exc) == "connect_refused", repr(exc)
    with urllib3.PoolManager(retries=urllib3.Retry(total=0), timeout=5) as pool:
        exc = raised(pool.request, "POST", refused_url, body=b"{}")
    assert isinstance(exc, urllib3.exceptions.MaxRetryError)
    assert classify(exc) == "connect_refused", repr(exc)


def test_httpx_refused_is_connect_refused(refused_url):
    httpx = pytest.importorskip("httpx", reason="python3-httpx is not installed")
    with httpx.Client(trust_env=False, timeout=5) as client:
        exc = raised(client.post, refused_url, json={})
    assert isinstance(exc, httpx.ConnectError)
    assert classify(exc) == "connect_refused", repr(exc)


def test_requests_dns_failure_is_dns():
    requests = pytest.importorskip("requests", reason="python3-requests is not installed")
    with requests.Session() as session:
        session.trust_env = False
        exc = raised(session.get, "http://retryd-test.invalid/", timeout=5)
    assert classify(exc) == "dns", repr(exc)


def test_requests_read_timeout_is_timeout():
    requests = pytest.importorskip("requests", reason="python3-requests is not installed")
    # A listener that accepts (through the backlog) and never answers.
    with socket.create_server(("127.0.0.1", 0)) as server, requests.Session() as session:
        session.trust_env = False
        url = f"http://127.0.0.1:{server.getsockname()[1]}/"
        exc = raised(session.post, url, json={}, timeout=0.2)
    assert isinstance(exc, requests.exceptions.ReadTimeout)
    assert classify(exc) == "timeout", repr(exc)


def test_timeout_while_handling_a_refusal_is_a_timeout():
    # The refusal is only the context of a later attempt elsewhere, which timed out after the
    # request may have been sent: the exception raised decides, not what was being handled.
    try:
        try:
            raise ConnectionRefusedError("primary")
        except ConnectionRefusedError:
            raise socket.timeout("secondary")
    except socket.timeout as e:
        exc = e
    assert isinstance(exc.__context__, ConnectionRefusedError)
    assert classify(exc) == "timeout"

    # The same with a client's own timeout class, which carries no socket error of its own.
    class PoolTimeout(Exception):
        pass

    try:
        try:
            raise ConnectionRefusedError("primary")
        except ConnectionRefusedError:
            raise PoolTimeout("secondary")
    except PoolTimeout as e:
        exc = e
    assert classify(exc) == "timeout"


def test_suppressed_context_is_not_followed():
    try:
        try:
            raise ConnectionRefusedError()
        except ConnectionRefusedError:
            raise RuntimeError("unrelated") from None
    except RuntimeError as e:
        exc = e
    assert classify(exc) is None


def test_self_referencing_chain_terminates():
    exc = RuntimeError("loops")
    exc.__context__ = exc
    assert classify(exc) is None
    exc = urllib.error.URLError(None)
    exc.reason = exc
    assert classify(exc) == "other"
    # A loop through the attributes the clients use, with the refusal behind it.
    outer, inner = RuntimeError("outer"), RuntimeError("inner", ConnectionRefusedError())
    outer.reason, inner.__cause__ = inner, outer
    assert classify(outer) == "connect_refused"
    # A chain longer than the walk's depth limit ends the walk instead of recursing.
    head = RuntimeError(0)
    for i in range(1, 10000):
        head = RuntimeError(i, head)
    assert classify(head) is None


def test_requests_refused_post_is_retried(make_segment, vtime, refused_url):
    requests = pytest.importorskip("requests", reason="python3-requests is not installed")
    seg = make_segment(orders={"min_calls": 1000})
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    session = requests.Session()
    session.trust_env = False

    def attempt(a):
        if a.number == 0:
            return session.post(refused_url, json={}, timeout=5)
        return "created"

    try:
        orders = client.dependency("orders")
        assert orders.call(attempt, method="POST", env=vtime.env()) == "created"
    finally:
        session.close()
        client.close()
