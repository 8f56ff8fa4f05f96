"""The client attached through the daemon's Unix socket: the real retryd ($RETRYD_DAEMON, set
by ctest), a sealed segment it hands over, and limits shared with another process."""

import multiprocessing
import os
import signal
import pathlib
import socket as socketlib
import subprocess
import time

import pytest

import retryd


def _answers(path):
    s = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_SEQPACKET)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


@pytest.fixture
def daemon(tmp_path):
    binary = os.environ.get("RETRYD_DAEMON")
    if not binary:
        root = pathlib.Path(__file__).resolve().parents[3]
        for path in sorted(root.glob("build*/daemon/retryd")):
            binary = str(path)
            break
    if not binary:
        pytest.skip("retryd not built")
    sock = str(tmp_path / "retryd.sock")
    config = tmp_path / "retryd.toml"
    config.write_text(f'[daemon]\nsocket = "{sock}"\n\n'
                      '[dependency.orders]\nbulkhead_limit = 1\n')
    log = open(tmp_path / "retryd.log", "w")
    proc = subprocess.Popen([binary, f"--config={config}"], stdout=log, stderr=log)
    deadline = time.monotonic() + 10
    while not _answers(sock):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail("retryd did not answer: " + (tmp_path / "retryd.log").read_text())
        time.sleep(0.02)
    yield sock
    proc.terminate()
    proc.wait(timeout=10)
    log.close()


def _hold(sock, conn):
    client = retryd.Client(socket=sock, fallback_to_local=False)
    with client.dependency("orders").admit():
        conn.send("holding")
        conn.recv()


def test_attaches_through_the_socket_and_shares_the_bulkhead(daemon):
    client = retryd.Client(socket=daemon, fallback_to_local=False)
    assert not client.local
    orders = client.dependency("orders")
    with orders.admit():
        pass
    # Another process holds the one bulkhead slot: this one is refused until it lets go.
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    holder = ctx.Process(target=_hold, args=(daemon, child))
    holder.start()
    assert parent.recv() == "holding"
    with pytest.raises(retryd.Rejected) as rejected:
        orders.admit()
    assert rejected.value.reason == "bulkhead_full"
    parent.send("done")
    holder.join(timeout=10)
    assert holder.exitcode == 0
    with orders.admit():
        pass
    client.close()


def test_no_daemon_at_the_socket_is_an_error_that_names_it(tmp_path):
    missing = str(tmp_path / "none.sock")
    with pytest.raises(retryd.ClientError) as err:
        retryd.Client(socket=missing, fallback_to_local=False)
    assert missing in str(err.value)
    local = retryd.Client(socket=missing)
    assert local.local
    local.close()


def _daemon_pid(sock):
    # The daemon is the process that holds the socket's lock file open.
    lock = os.path.realpath(sock + ".lock")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.path.realpath(f"/proc/{pid}/fd/{fd}") == lock:
                    return int(pid)
        except OSError:
            continue
    return None


def test_a_stopped_daemon_neither_fails_nor_delays_a_new_client(daemon):
    pid = _daemon_pid(daemon)
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        client = retryd.Client(socket=daemon)
        opened = time.monotonic() - start
        assert opened < 0.2, f"the client waited {opened:.3f} s for the stopped daemon"
        assert client.local
        orders = client.dependency("orders")
        slowest = 0.0
        for _ in range(20):
            t = time.monotonic()
            with orders.admit():
                pass
            slowest = max(slowest, time.monotonic() - t)
        assert slowest < 0.2, f"an admit waited {slowest:.3f} s for the stopped daemon"
    finally:
        os.kill(pid, signal.SIGCONT)
    # Resumed, the daemon answers the hello the client sent; a later call moves it over.
    deadline = time.monotonic() + 60
    while client.local:
        assert time.monotonic() < deadline, "the client never attached after the daemon resumed"
        with orders.admit():
            pass
        time.sleep(0.002)
