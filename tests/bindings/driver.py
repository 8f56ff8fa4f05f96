"""What the bindings' test drivers share (tests/bindings/<language>/*_binding_test.py): their
log and failure lines, polling a condition, a private retryd on a socket of theirs, a free port.
Every wait polls its condition with a generous timeout: the machine may be loaded."""

import json
import pathlib
import socket
import subprocess
import sys
import time

TIMEOUT = 60.0


def log(msg):
    print(msg, flush=True)


def fail(msg):
    print("FAIL: " + msg, flush=True)
    sys.exit(1)


def wait_for(what, cond, timeout=TIMEOUT, interval=0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def answers(path, kind=socket.SOCK_SEQPACKET):
    """Whether a Unix socket of `kind` at `path` accepts a connection (retryd's is seqpacket,
    php-fpm's a stream)."""
    s = socket.socket(socket.AF_UNIX, kind)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


class Daemon:
    """retryd on a config of ours, attaching workers through a socket in `tmp`: `deps` maps
    each dependency's name to its settings, `daemon_settings` adds to [daemon]."""

    def __init__(self, binary, tmp, deps, daemon_settings=None):
        self.sock = str(pathlib.Path(tmp) / "retryd.sock")
        config = pathlib.Path(tmp) / "retryd.toml"
        text = f'[daemon]\nsocket = "{self.sock}"\ntick = "10ms"\n'
        for k, v in (daemon_settings or {}).items():
            text += f"{k} = {json.dumps(v)}\n"
        for name, settings in deps.items():
            text += f"\n[dependency.{name}]\n"
            for k, v in settings.items():
                text += f"{k} = {json.dumps(v)}\n"
        config.write_text(text)
        self.log_path = pathlib.Path(tmp) / "retryd.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([binary, f"--config={config}"], stdout=self.log,
                                     stderr=self.log)

        def up():
            if self.proc.poll() is not None:
                fail("retryd exited: " + self.log_path.read_text())
            return answers(self.sock)
        wait_for("retryd to answer on its socket", up)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port
