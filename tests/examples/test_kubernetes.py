"""examples/kubernetes/retryd.yaml: one retryd per node, shared by the node's pods through a
socket on a hostPath. Checks that what the manifest says holds together with the real binaries:
its config passes `retryd --check_config`, the daemon's socket is where the workers look for it,
the workers' group may connect, and the image's Dockerfile installs the Debian package of every
shared library the binaries load."""

import os
import pathlib
import re
import subprocess
import tomllib

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "examples" / "kubernetes" / "retryd.yaml"
# In every debian:12 image already: the C and C++ runtimes.
BASE_IMAGE = {"libc6", "libstdc++6", "libgcc-s1"}


def _docs():
    return {d["kind"]: d for d in yaml.safe_load_all(MANIFEST.read_text()) if d}


def _config():
    return _docs()["ConfigMap"]["data"]["retryd.toml"]


def _pod(kind):
    return _docs()[kind]["spec"]["template"]["spec"]


def _host_dir(pod, container, path):
    """The hostPath behind the directory `path` of `container` in `pod`."""
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert path in mounts, f"{container['name']} does not mount {path}"
    volume = next(v for v in pod["volumes"] if v["name"] == mounts[path])
    return volume["hostPath"]["path"]


def test_the_config_passes_the_daemons_check(tmp_path):
    config = tmp_path / "retryd.toml"
    config.write_text(_config())
    r = subprocess.run([os.environ["RETRYD_DAEMON"], f"--check_config={config}"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_the_workers_reach_the_daemons_socket_on_the_same_host_path():
    sock = tomllib.loads(_config())["daemon"]["socket"]
    run_dir = str(pathlib.PurePosixPath(sock).parent)
    daemon, worker = _pod("DaemonSet"), _pod("Deployment")
    daemon_host = _host_dir(daemon, daemon["containers"][0], run_dir)
    container = worker["containers"][0]
    assert _host_dir(worker, container, run_dir) == daemon_host
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["RETRYD_SOCKET"] == sock


def test_the_workers_group_may_connect():
    daemon = tomllib.loads(_config())["daemon"]
    group = str(_pod("Deployment")["securityContext"]["runAsGroup"])
    assert daemon["group"] == group, "the socket file's group"
    assert int(daemon["mode"], 8) & 0o060 == 0o060, "the group may read and write the socket"
    assert group in daemon["allow_groups"]


def _packages_needed(binary):
    """The Debian packages of the shared libraries `binary` names (its NEEDED entries, found
    with ldd, owned per dpkg -S); apt installs what those need in turn."""
    dynamic = subprocess.run(["readelf", "-d", binary], capture_output=True, text=True,
                             check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", dynamic)
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    found = dict(re.findall(r"^\s*(\S+) => (/\S+)", out, re.M))
    packages = set()
    for name in needed:
        if name.startswith("ld-linux") or name not in found:
            continue
        path = found[name]
        real = os.path.realpath(path)
        for candidate in (path, real, real.replace("/usr/lib/", "/lib/", 1)):
            r = subprocess.run(["dpkg", "-S", candidate], capture_output=True, text=True)
            if r.returncode == 0:
                packages.add(r.stdout.split(":")[0])
                break
        else:
            pytest.fail(f"{binary} loads {path}, which no Debian package holds")
    return packages


def test_the_image_installs_every_library_the_binaries_load():
    text = MANIFEST.read_text()
    install = re.search(r"apt-get install -y --no-install-recommends(.*?)&&", text, re.S)
    assert install, "the Dockerfile's apt-get install line"
    listed = set(install.group(1).replace("#", " ").replace("\\", " ").split())
    needed = set()
    for binary in (os.environ["RETRYD_DAEMON"], os.environ["RETRYCTL"]):
        needed |= _packages_needed(binary)
    # Sanitizer runtimes are there only in instrumented test builds.
    needed = {p for p in needed if not re.match(r"lib(a|t|ub|l)san\d|libclang", p)}
    assert needed - BASE_IMAGE <= listed, f"missing: {sorted(needed - BASE_IMAGE - listed)}"
