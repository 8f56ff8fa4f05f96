"""Fixtures: real named segments made by the retryd_test_segment helper, and virtual time.

The helper is found through $RETRYD_TEST_SEGMENT (set by ctest), else in the source tree's
build directories. The library through $RETRYD_LIBRARY, else as the package finds it.
"""

import itertools
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bindings" / "python"))

import retryd  # noqa: E402


def _helper():
    env = os.environ.get("RETRYD_TEST_SEGMENT")
    if env:
        return env
    for path in sorted(ROOT.glob("build*/tests/client/retryd_test_segment")):
        return str(path)
    return None


class Segment:
    """A named segment held by a helper process; removed when the test ends."""

    _ids = itertools.count()

    def __init__(self, helper, deps):
        self.name = f"retryd-pytest-{os.getpid()}-{next(self._ids)}"
        specs = []
        for dep, settings in deps.items():
            # Config keys with TOML values: {"open_for": "60s"} -> open_for="60s".
            pairs = ",".join(f"{k}={json.dumps(v)}" for k, v in settings.items())
            specs.append(f"{dep}:{pairs}" if pairs else dep)
        self.proc = subprocess.Popen([helper, self.name, *specs], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().strip()
        if line != "READY":
            self.proc.kill()
            raise RuntimeError(f"retryd_test_segment did not start: {line!r}")

    def _ask(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def state(self, dep):
        """The breaker state: "closed", "open" or "half-open"."""
        return self._ask(f"state {dep}")

    def reset(self, dep):
        return self._ask(f"reset {dep}")

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=10)


@pytest.fixture
def make_segment():
    helper = _helper()
    if helper is None:
        pytest.skip("retryd_test_segment not built (ninja retryd_test_segment)")
    try:
        retryd.library_path()
    except retryd.LibraryNotFound as e:
        pytest.skip(str(e))
    made = []

    def make(**deps):
        seg = Segment(helper, deps)
        made.append(seg)
        return seg

    yield make
    for seg in made:
        seg.close()


class VirtualTime:
    """A monotonic clock and a sleep that only advances it."""

    def __init__(self):
        self.now = 10**12
        self.sleeps = []

    def now_ns(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += int(seconds * 1e9)

    def advance(self, seconds):
        self.now += int(seconds * 1e9)

    def env(self):
        return retryd.Env(now_ns=self.now_ns, sleep=self.sleep, random=lambda: 2**63)


@pytest.fixture
def vtime():
    return VirtualTime()


def retryctl_path():
    """The retryctl binary: $RETRYD_RETRYCTL, else beside the daemon of $RETRYD_DAEMON (the
    same build), else in the source tree's build directories; None if not built."""
    env = os.environ.get("RETRYD_RETRYCTL")
    if env:
        return env
    daemon = os.environ.get("RETRYD_DAEMON")
    if daemon:
        beside = pathlib.Path(daemon).resolve().parents[1] / "cli" / "retryctl"
        if beside.exists():
            return str(beside)
    for path in sorted(ROOT.glob("build*/cli/retryctl")):
        return str(path)
    return None


def retryctl_json(segment, *args):
    """`retryctl --segment SEGMENT ARGS... --json`, parsed. Status exits 1 while a breaker is
    open, which is no error here."""
    binary = retryctl_path()
    if binary is None:
        pytest.skip("retryctl not built")
    proc = subprocess.run([binary, "--segment", segment, *args, "--json"], capture_output=True,
                          text=True, timeout=60)
    if proc.returncode not in (0, 1, 3):
        raise RuntimeError(f"retryctl {' '.join(args)}: exit {proc.returncode}: {proc.stderr}")
    return json.loads(proc.stdout)


def dependency_status(segment, dep):
    """One dependency's entry of `retryctl status --json`."""
    for entry in retryctl_json(segment, "status")["dependencies"]:
        if entry["name"] == dep:
            return entry
    raise KeyError(dep)
