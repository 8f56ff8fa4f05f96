"""examples/kubernetes: one retryd per node, shared by the node's pods through a socket on a
hostPath, in images built from the project's Debian packages. Checks that what the manifest and
the Dockerfiles say holds together with the real binaries and debian/:

- the config passes `retryd --check_config` as the pod's user, and that daemon serves its
  socket with no capability, the directory made by the init container's command with the
  capabilities the manifest grants it;
- the liveness and readiness probes name a retryctl command that exits 0 while the daemon
  serves and 3 (down or stale) when none runs or it is stopped;
- the socket, the workers' group, the textfile and the sidecar's port agree across the config,
  the pods and the Prometheus annotations;
- every container runs as a non-root user with no capability, a read-only root and the runtime's
  seccomp profile, and the namespaces whose pods mount a hostPath admit them;
- the images install the packages of debian/control with apt from dist/, copy nothing from a
  build tree, and run as the users the pods name;
- worker.py calls through the real daemon;
- with a Docker daemon and built packages, the images build and run `retryd --check_config`
  and `retryctl --help` (skipped otherwise: the checks above need neither).

Environment: RETRYD_DAEMON, RETRYCTL (binaries); RETRYD_LIBRARY (libretryd.so) for worker.py.
"""

import http.server
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "kubernetes"
MANIFEST = EXAMPLE / "retryd.yaml"
DAEMON = os.environ["RETRYD_DAEMON"]
RETRYCTL = os.environ["RETRYCTL"]
# retryctl's exit status for a daemon that is down or stale (its --help, "Exit status").
EXIT_DAEMON_DOWN = 3


def _docs():
    return [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]


def _one(kind):
    found = [d for d in _docs() if d["kind"] == kind]
    assert len(found) == 1, f"one {kind} in the manifest, found {len(found)}"
    return found[0]


def _config_text():
    return _one("ConfigMap")["data"]["retryd.toml"]


def _config():
    return tomllib.loads(_config_text())["daemon"]


def _pod(kind):
    return _one(kind)["spec"]["template"]["spec"]


def _container(pod, name):
    return next(c for c in pod.get("initContainers", []) + pod["containers"] if c["name"] == name)


def _volume(pod, container, path):
    """The volume behind the directory `path` of `container` in `pod`."""
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert path in mounts, f"{container['name']} does not mount {path}"
    return next(v for v in pod["volumes"] if v["name"] == mounts[path])


def _parent(path):
    return str(pathlib.PurePosixPath(path).parent)


def _probe_commands():
    """The exec commands of the daemon container's liveness and readiness probes."""
    daemon = _container(_pod("DaemonSet"), "retryd")
    return {probe: daemon[probe]["exec"]["command"] for probe in ("livenessProbe", "readinessProbe")}


def _security(pod, container):
    """A container's effective security settings: its own, else the pod's."""
    return {**pod.get("securityContext", {}), **container.get("securityContext", {})}


def _dockerfile(name):
    """The instructions of examples/kubernetes/NAME as (INSTRUCTION, arguments), continuation
    lines joined and comments dropped."""
    lines, joined = [], ""
    for line in (EXAMPLE / name).read_text().splitlines():
        if not joined and (not line.strip() or line.lstrip().startswith("#")):
            continue
        joined += line.rstrip()
        if joined.endswith("\\"):
            joined = joined[:-1] + " "
            continue
        word, _, rest = joined.strip().partition(" ")
        lines.append((word.upper(), rest.strip()))
        joined = ""
    return lines


def _apt_installs(name):
    """What the RUN lines of Dockerfile NAME give `apt-get install`."""
    installed = []
    for word, rest in _dockerfile(name):
        for command in re.split(r"&&|;", rest) if word == "RUN" else []:
            args = command.split()
            if args[:2] == ["apt-get", "install"]:
                installed += [a for a in args[2:] if not a.startswith("-")]
    return installed


def _control_packages():
    return re.findall(r"^Package: (\S+)$", (ROOT / "debian" / "control").read_text(), re.M)


def _deb_package(path):
    """The package of a .deb path: the file name up to its first underscore."""
    return pathlib.PurePosixPath(path).name.split("_")[0]


def _user(name):
    """USER of Dockerfile NAME, as (uid, gid)."""
    users = [rest for word, rest in _dockerfile(name) if word == "USER"]
    assert len(users) == 1, f"{name}: one USER, numeric so Kubernetes can see it is not root"
    uid, gid = users[0].split(":")
    return int(uid), int(gid)


def _pod_user(kind):
    context = _pod(kind)["securityContext"]
    return context["runAsUser"], context["runAsGroup"]


# --- The daemon, as the pod runs it --------------------------------------------------------


@pytest.fixture
def node(tmp_path):
    """A temporary stand-in for a node and a pod: the binaries, the config with its paths moved
    under a directory every user may pass through, the socket's directory and the textfile's
    (an emptyDir: mode 0777), and what to run."""
    base = pathlib.Path(tempfile.mkdtemp(prefix="retryd-k8s-"))
    base.chmod(0o755)
    try:
        config = _config()
        bin_dir = base / "bin"
        bin_dir.mkdir()
        # Copies, so that the pod's user can run them wherever the build tree is.
        daemon = shutil.copy(DAEMON, bin_dir / "retryd")
        retryctl = shutil.copy(RETRYCTL, bin_dir / "retryctl")
        run_dir, metrics_dir = base / "run", base / "metrics"
        metrics_dir.mkdir()
        metrics_dir.chmod(0o777)
        socket = str(run_dir / pathlib.PurePosixPath(config["socket"]).name)
        textfile = str(metrics_dir / pathlib.PurePosixPath(config["metrics_textfile"]).name)
        text = _config_text()
        for old, new in ((config["socket"], socket), (config["metrics_textfile"], textfile)):
            assert text.count(f'"{old}"') == 1, old
            text = text.replace(f'"{old}"', f'"{new}"')
        config_file = base / "retryd.toml"
        config_file.write_text(text)
        config_file.chmod(0o644)

        class Node:
            pass
        n = Node()
        n.base, n.daemon, n.retryctl, n.config = base, daemon, retryctl, str(config_file)
        n.run_dir, n.socket, n.metrics_dir, n.textfile = run_dir, socket, metrics_dir, textfile
        yield n
    finally:
        shutil.rmtree(base)


def _as_pod_user():
    """subprocess arguments that run a process as the DaemonSet's pod runs its containers: its
    uid, its gid, its supplementary groups, and no capability (a root process that changes to
    another uid loses them all)."""
    context = _pod("DaemonSet")["securityContext"]
    return dict(user=context["runAsUser"], group=context["runAsGroup"],
                extra_groups=context.get("supplementalGroups", []))


def _run_init_container(n):
    """Runs the init container's command on the node's socket directory as root with only the
    capabilities the manifest grants it (setpriv's bounding set)."""
    init = _container(_pod("DaemonSet"), "socket-dir")
    caps = init["securityContext"]["capabilities"]
    assert caps["drop"] == ["ALL"]
    bounding = ",".join(["-all"] + [f"+{c.lower()}" for c in caps.get("add", [])])
    run_dir = _config()["socket"].rpartition("/")[0]
    command = [str(n.run_dir) if a == run_dir else a for a in init["command"]]
    assert command != init["command"], f"the init container's command names {run_dir}"
    return subprocess.run(["setpriv", f"--bounding-set={bounding}", "--inh-caps=-all",
                           "--ambient-caps=-all", *command], capture_output=True, text=True)


def _probe(n, **user):
    """Runs the liveness probe's command against the node's socket; returns its exit status."""
    command = _probe_commands()["livenessProbe"]
    socket = _config()["socket"]
    argv = [n.retryctl] + [n.socket if a == socket else a for a in command[1:]]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, **user).returncode


def _root_only():
    if os.geteuid() != 0:
        pytest.skip("runs the daemon as the pod's uid and groups, which only root can")


def test_the_config_passes_the_daemons_check_as_the_pods_user(node):
    _root_only()
    r = subprocess.run([node.daemon, f"--check_config={node.config}"], capture_output=True,
                       text=True, **_as_pod_user())
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_daemon_serves_as_the_pods_user_and_the_probe_sees_it_up_hung_and_down(node):
    """The init container's command makes the socket's directory (twice: a pod that restarts
    finds it made), the daemon runs there as the pod's user, the probe exits 0 while it serves,
    3 while it is stopped (a hung daemon) and 3 once it is gone."""
    _root_only()
    for _ in range(2):
        r = _run_init_container(node)
        assert r.returncode == 0, r.stderr
    st = node.run_dir.stat()
    user = _as_pod_user()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (user["user"], int(_config()["group"]),
                                                           0o750)
    assert _probe(node, **user) == EXIT_DAEMON_DOWN, "no daemon yet"
    log = open(node.base / "retryd.log", "w")
    daemon = subprocess.Popen([node.daemon, f"--config={node.config}"], stderr=log, **user)
    try:
        deadline = time.monotonic() + 15
        while _probe(node, **user) != 0:
            assert daemon.poll() is None, (node.base / "retryd.log").read_text()
            assert time.monotonic() < deadline, "the daemon did not serve within 15 s"
            time.sleep(0.1)
        # A worker of the Deployment's uid and gid attaches too.
        worker = _pod("Deployment")["securityContext"]
        assert _probe(node, user=worker["runAsUser"], group=worker["runAsGroup"]) == 0
        daemon.send_signal(signal.SIGSTOP)
        try:
            assert _probe(node, **user) == EXIT_DAEMON_DOWN, "a stopped daemon is not serving"
        finally:
            daemon.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + 15
        while _probe(node, **user) != 0:
            assert time.monotonic() < deadline, "the daemon did not serve again after SIGCONT"
            time.sleep(0.1)
        deadline = time.monotonic() + 15
        while not os.path.exists(node.textfile):
            assert time.monotonic() < deadline, "no textfile within 15 s"
            time.sleep(0.1)
        # node_exporter's user (nobody) may read it; nothing else is left in its directory.
        assert os.stat(node.textfile).st_mode & 0o004
        assert "retryd_daemon_heartbeat_timestamp_seconds" in pathlib.Path(node.textfile).read_text()
        assert os.listdir(node.metrics_dir) == [os.path.basename(node.textfile)]
        # What the daemon writes on the node: its socket and the lock file beside it.
        name = os.path.basename(node.socket)
        assert sorted(os.listdir(node.run_dir)) == [name, name + ".lock"]
    finally:
        daemon.terminate()
        daemon.wait(timeout=15)
        log.close()
    assert daemon.returncode == 0, (node.base / "retryd.log").read_text()
    assert _probe(node, **user) == EXIT_DAEMON_DOWN, "no daemon any more"


def test_the_probes_run_retryctl_as_packaged_and_exit_down_with_no_daemon(tmp_path):
    probes = _probe_commands()
    assert probes["livenessProbe"] == probes["readinessProbe"]
    command = probes["livenessProbe"]
    installed = (ROOT / "debian" / "retryd.install").read_text().split()
    assert command[0].lstrip("/") in installed, f"{command[0]}: not a file of the retryd package"
    assert pathlib.PurePosixPath(command[0]).name == "retryctl"
    assert command[command.index("--socket") + 1] == _config()["socket"]
    # The subcommand is one whose exit status says only whether the daemon serves: not
    # `status`, which also fails on an open breaker.
    assert command[-1] in ("workers", "metrics"), command
    help_text = subprocess.run([RETRYCTL, "--help"], capture_output=True, text=True,
                               check=True).stdout
    assert re.search(rf"^  {command[-1]}\s", help_text, re.M)
    argv = [RETRYCTL] + [str(tmp_path / "retryd.sock") if a == _config()["socket"] else a
                         for a in command[1:]]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert r.returncode == EXIT_DAEMON_DOWN, r.stderr
    assert "DAEMON DOWN" in r.stderr
    daemon = _container(_pod("DaemonSet"), "retryd")
    # The probe waits at most 1 s for the daemon's answer.
    assert daemon["livenessProbe"]["timeoutSeconds"] > 1


# --- The pieces of the manifest ------------------------------------------------------------


def test_the_workers_reach_the_daemons_socket_on_the_same_host_path():
    sock = _config()["socket"]
    run_dir = _parent(sock)
    daemon, worker = _pod("DaemonSet"), _pod("Deployment")
    daemon_volume = _volume(daemon, _container(daemon, "retryd"), run_dir)
    assert _volume(daemon, _container(daemon, "socket-dir"), run_dir) == daemon_volume
    container = worker["containers"][0]
    worker_volume = _volume(worker, container, run_dir)
    assert worker_volume["hostPath"]["path"] == daemon_volume["hostPath"]["path"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["RETRYD_SOCKET"] == sock
    # The worker needs the socket only: no /dev/shm of the host, no host IPC namespace.
    assert not worker.get("hostIPC")
    assert all(v.get("hostPath", {}).get("path") == daemon_volume["hostPath"]["path"]
               for v in worker["volumes"] if "hostPath" in v)


def test_the_workers_group_may_connect_and_the_daemon_may_give_it_the_socket():
    daemon = _config()
    group = str(_pod("Deployment")["securityContext"]["runAsGroup"])
    assert daemon["group"] == group, "the socket file's group"
    assert int(daemon["mode"], 8) & 0o060 == 0o060, "the group may read and write the socket"
    assert group in daemon["allow_groups"]
    # Without CAP_CHOWN, the daemon gives the socket only to a group it is in.
    assert int(group) in _pod("DaemonSet")["securityContext"]["supplementalGroups"]
    # The init container gives the socket's directory to the daemon and to the workers' group.
    init = _container(_pod("DaemonSet"), "socket-dir")["command"]
    uid, _ = _pod_user("DaemonSet")
    assert init[init.index("-o") + 1] == str(uid)
    assert init[init.index("-g") + 1] == group
    assert int(init[init.index("-m") + 1], 8) & 0o050 == 0o050


def test_the_sidecar_serves_the_daemons_textfile_where_prometheus_scrapes():
    pod_template = _one("DaemonSet")["spec"]["template"]
    pod = pod_template["spec"]
    textfile = _config()["metrics_textfile"]
    assert textfile.endswith(".prom"), "the textfile collector reads *.prom files only"
    directory = _parent(textfile)
    sidecar = _container(pod, "metrics")
    assert re.fullmatch(r"quay\.io/prometheus/node-exporter:v\d+\.\d+\.\d+", sidecar["image"])
    args = sidecar["args"]
    assert f"--collector.textfile.directory={directory}" in args
    assert "--collector.textfile" in args and "--collector.disable-defaults" in args
    # The daemon writes in the directory the sidecar reads: one emptyDir, in both at that path.
    volume = _volume(pod, _container(pod, "retryd"), directory)
    assert "emptyDir" in volume
    assert _volume(pod, sidecar, directory) == volume
    assert next(m for m in sidecar["volumeMounts"] if m["mountPath"] == directory)["readOnly"]
    # The port it listens on is the one named metrics and the one Prometheus is told of.
    listen = next(a for a in args if a.startswith("--web.listen-address="))
    port = int(listen.rpartition(":")[2])
    ports = {p["name"]: p["containerPort"] for p in sidecar["ports"]}
    assert ports["metrics"] == port
    annotations = pod_template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(port)
    assert annotations["prometheus.io/path"] == "/metrics"
    assert sidecar["livenessProbe"]["httpGet"]["port"] in ("metrics", port)


def test_every_container_runs_unprivileged_but_the_one_root_step():
    checked = 0
    for kind in ("DaemonSet", "Deployment"):
        pod = _pod(kind)
        assert not (pod.get("hostNetwork") or pod.get("hostPID") or pod.get("hostIPC")), kind
        for container in pod.get("initContainers", []) + pod["containers"]:
            s = _security(pod, container)
            name = f"{kind}/{container['name']}"
            assert s["allowPrivilegeEscalation"] is False, name
            assert s["readOnlyRootFilesystem"] is True, name
            assert s["capabilities"]["drop"] == ["ALL"], name
            assert s["seccompProfile"] == {"type": "RuntimeDefault"}, name
            assert not s.get("privileged"), name
            if kind == "DaemonSet" and container["name"] == "socket-dir":
                # The chown and chmod of the node's directory: Pod Security's baseline level
                # allows these two capabilities.
                assert s["runAsUser"] == 0
                assert sorted(s["capabilities"]["add"]) == ["CHOWN", "FOWNER"]
            else:
                assert s["runAsNonRoot"] is True and s["runAsUser"] > 0, name
                assert "add" not in s["capabilities"], name
            checked += 1
    assert checked == 4


def test_the_namespaces_admit_the_pods_that_mount_a_host_path():
    namespaces = {d["metadata"]["name"]: d for d in _docs() if d["kind"] == "Namespace"}
    for doc in _docs():
        if doc["kind"] == "Namespace":
            continue
        namespace = doc["metadata"]["namespace"]
        assert namespace in namespaces, f"{doc['kind']} {doc['metadata']['name']}"
        pod = doc.get("spec", {}).get("template", {}).get("spec")
        if pod and any("hostPath" in v for v in pod["volumes"]):
            labels = namespaces[namespace]["metadata"]["labels"]
            # Pod Security's baseline and restricted levels reject hostPath volumes.
            assert labels["pod-security.kubernetes.io/enforce"] == "privileged", namespace


# --- The images ----------------------------------------------------------------------------


def test_the_images_are_debian_12_slim_with_nothing_from_a_build_tree():
    for name in ("Dockerfile", "Dockerfile.worker"):
        lines = _dockerfile(name)
        assert [rest for word, rest in lines if word == "FROM"] == ["debian:12-slim"], name
        for word, rest in lines:
            if word in ("COPY", "ADD"):
                assert word == "COPY", f"{name}: {word} {rest}"
                sources = rest.split()[:-1]
                assert not any(s.startswith("--from") for s in sources), name
                assert not any(s.startswith("build") for s in sources), f"{name}: {rest}"
                for s in sources:
                    assert s.startswith("dist/") and s.endswith(".deb") or (ROOT / s).is_file(), s


def test_the_images_install_packages_of_debian_control_with_apt():
    packages = _control_packages()
    expected = {"Dockerfile": {"retryd"}, "Dockerfile.worker": {"libretryd0", "python3-retryd"}}
    for name, wanted in expected.items():
        copied = [s for word, rest in _dockerfile(name) if word == "COPY"
                  for s in rest.split()[:-1] if s.endswith(".deb")]
        debs = [a for a in _apt_installs(name) if a.endswith(".deb")]
        # apt-get install, not dpkg -i: apt brings each package's Depends from the archive.
        assert {_deb_package(d) for d in debs} == wanted, name
        assert {_deb_package(c) for c in copied} == wanted, name
        assert all(_deb_package(d) in packages for d in debs), name
        assert not any(word == "RUN" and "dpkg -i" in rest for word, rest in _dockerfile(name))
        # With BuildKit, the Dockerfile's own ignore file sends the builder what it copies.
        ignore = (EXAMPLE / f"{name}.dockerignore").read_text().split("\n")
        for source in [s for word, rest in _dockerfile(name) if word == "COPY"
                       for s in rest.split()[:-1]]:
            assert f"!{source}" in ignore, f"{name}.dockerignore leaves out {source}"


def test_the_packages_bring_what_the_binaries_load():
    """retryd's Depends are its libraries' packages (debian/control's ${shlibs:Depends}, which
    dpkg-shlibdeps fills in), except a library of the project itself, whose package the image
    has to install from dist/ too: none of the binaries loads one today."""
    control = (ROOT / "debian" / "control").read_text()
    stanza = re.search(r"^Package: retryd\n(.*?)(?:\n\n|\Z)", control, re.M | re.S).group(1)
    assert "${shlibs:Depends}" in re.search(r"^Depends: (.*)$", stanza, re.M).group(1)
    project_libs = {}
    for install in (ROOT / "debian").glob("*.install"):
        for line in install.read_text().splitlines():
            if ".so" in line:
                project_libs[pathlib.PurePosixPath(line.split()[0]).name.split(".so")[0]] = \
                    install.stem
    needed_packages = set()
    for binary in (DAEMON, RETRYCTL):
        dynamic = subprocess.run(["readelf", "-d", binary], capture_output=True, text=True,
                                 check=True).stdout
        for lib in re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", dynamic):
            if lib.split(".so")[0] in project_libs:
                needed_packages.add(project_libs[lib.split(".so")[0]])
    installed = {_deb_package(d) for d in _apt_installs("Dockerfile") if d.endswith(".deb")}
    assert needed_packages <= installed, f"missing: {sorted(needed_packages - installed)}"


def test_the_images_run_as_the_users_the_pods_name():
    uid, gid = _user("Dockerfile")
    assert (uid, gid) == _pod_user("DaemonSet")
    # The packaged user (systemd/retryd.sysusers), made with these ids before the package.
    sysusers = (ROOT / "systemd" / "retryd.sysusers").read_text()
    user = re.search(r"^u (\S+) ", sysusers, re.M).group(1)
    runs = " ".join(rest for word, rest in _dockerfile("Dockerfile") if word == "RUN")
    assert re.search(rf"groupadd --system --gid {gid} {user}\b", runs)
    assert re.search(rf"useradd --system --uid {uid} --gid {user}\b.* {user}\b", runs)
    assert runs.index("useradd") < runs.index("apt-get install")
    assert _user("Dockerfile.worker") == _pod_user("Deployment")
    entrypoint = next(rest for word, rest in _dockerfile("Dockerfile") if word == "ENTRYPOINT")
    assert '"/usr/sbin/retryd"' in entrypoint


# --- The worker ----------------------------------------------------------------------------


def test_the_worker_calls_through_the_daemon(tmp_path):
    """worker.py, as the worker image runs it, calls an HTTP server through the real daemon;
    its first attempt gets a 503 and the retry the host admits gets a 200."""
    library = os.environ.get("RETRYD_LIBRARY")
    if not library:
        pytest.skip("RETRYD_LIBRARY is not set (the ThreadSanitizer build runs no Python)")
    entry = next(rest for word, rest in _dockerfile("Dockerfile.worker") if word == "ENTRYPOINT")
    copy = next(rest.split() for word, rest in _dockerfile("Dockerfile.worker")
                if word == "COPY" and rest.endswith(".py"))
    assert copy[-1] in entry, "the image runs the worker it copies"
    script = ROOT / copy[0]

    requests = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            requests.append(self.path)
            self.send_response(503 if len(requests) == 1 else 200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    socket = str(tmp_path / "retryd.sock")
    config = tmp_path / "retryd.toml"
    config.write_text(f'[daemon]\nsocket = "{socket}"\n\n[dependency.payments]\n')
    daemon = subprocess.Popen([DAEMON, f"--config={config}"], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 15
        while subprocess.run([RETRYCTL, "--socket", socket, "workers"],
                             capture_output=True).returncode != 0:
            assert time.monotonic() < deadline, "the daemon did not serve within 15 s"
            time.sleep(0.1)
        env = {**os.environ, "RETRYD_SOCKET": socket, "CALLS": "2", "INTERVAL_SECONDS": "0",
               "PAYMENTS_URL": f"http://127.0.0.1:{server.server_port}/health",
               "PYTHONPATH": str(ROOT / "bindings" / "python")}
        r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert r.stderr.count("payments: status 200") == 2, r.stderr
        assert len(requests) == 3, "one retry after the 503"
        status = subprocess.run([RETRYCTL, "--socket", socket, "--json", "status", "payments"],
                                capture_output=True, text=True)
        assert '"payments"' in status.stdout, status.stdout + status.stderr
    finally:
        daemon.terminate()
        daemon.wait(timeout=15)
        server.shutdown()


# --- With Docker ---------------------------------------------------------------------------


def test_the_images_build_and_run_with_docker(tmp_path):
    docker = shutil.which("docker")
    if not docker:
        pytest.skip("no docker command")
    info = subprocess.run([docker, "info"], capture_output=True, text=True, timeout=60)
    if info.returncode != 0:
        pytest.skip("no Docker daemon answers (`docker info` failed): the image is not built")
    dist = sorted(p.name for p in (ROOT / "dist").glob("*.deb")) if (ROOT / "dist").is_dir() else []
    wanted = ("retryd_", "libretryd0_", "python3-retryd_")
    if not all(sum(n.startswith(w) for n in dist) == 1 for w in wanted):
        pytest.skip("dist/ does not hold one build of the packages: run scripts/package first")
    tag = f"retryd-k8s-test-{os.getpid()}"
    images = {"Dockerfile": f"{tag}:daemon", "Dockerfile.worker": f"{tag}:worker"}
    env = {**os.environ, "DOCKER_BUILDKIT": "1"}
    try:
        for name, image in images.items():
            r = subprocess.run([docker, "build", "-f", str(EXAMPLE / name), "-t", image, str(ROOT)],
                               capture_output=True, text=True, env=env, timeout=900)
            assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
        daemon = images["Dockerfile"]
        # The ConfigMap's config, as the pod runs it: in group 1000, the textfile's directory
        # an empty, writable one.
        config = tmp_path / "retryd.toml"
        config.write_text(_config_text())
        config.chmod(0o644)
        textfile_dir = _parent(_config()["metrics_textfile"])
        r = subprocess.run(
            [docker, "run", "--rm", "--read-only", "--cap-drop=ALL", "--group-add", "1000",
             "--tmpfs", f"{textfile_dir}:mode=0777", "-v", f"{config}:/etc/retryd/retryd.toml:ro",
             daemon, "--check_config=/etc/retryd/retryd.toml"],
            capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        r = subprocess.run([docker, "run", "--rm", "--entrypoint", "/usr/bin/retryctl", daemon,
                            "--help"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "Exit status" in r.stdout, r.stderr
        r = subprocess.run([docker, "run", "--rm", "--entrypoint", "id", daemon],
                           capture_output=True, text=True, timeout=120)
        uid, gid = _pod_user("DaemonSet")
        assert r.stdout.startswith(f"uid={uid}(retryd) gid={gid}(retryd)"), r.stdout
        r = subprocess.run([docker, "run", "--rm", "--entrypoint", "python3", images["Dockerfile.worker"],
                            "-c", "import retryd; retryd.Client().dependency('payments')"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
    finally:
        subprocess.run([docker, "rmi", "-f", *images.values()], capture_output=True)
