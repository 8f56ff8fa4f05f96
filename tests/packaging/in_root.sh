#!/bin/bash
# in_root.sh: run by clean_root.sh as root inside a minimal Debian root with no systemd running.
# Installs the packages in DIR with apt (dependencies from the archive), runs the daemon as the
# unit's ExecStart line says, as the packaged user, uses it from retryctl and from C, CMake and
# Python workers, then purges the packages and checks that nothing of them is left.
# Usage: in_root.sh DIR   (DIR holds the .debs and the consumer/ project)
set -euo pipefail
dir=${1:?"usage: in_root.sh DIR"}
packages=(retryd libretryd0 libretryd-dev python3-retryd)
export DEBIAN_FRONTEND=noninteractive
# step NAME: ends the current step, printing how long it took, and starts NAME.
current="" step_start=$SECONDS
step() {
  [ -z "$current" ] || echo "    $current: $((SECONDS - step_start))s"
  current=$1 step_start=$SECONDS
  echo "--- $1"
}
die() {
  echo "FAIL: $*" >&2
  exit 1
}

step "apt-get install ${packages[*]} from $dir"
apt-get install -y -q --no-install-recommends "$dir"/*.deb >"$dir/apt-install.log" 2>&1 ||
  { cat "$dir/apt-install.log"; die "apt-get install of the packages failed"; }
for pkg in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" | grep -q "install ok installed" || die "$pkg not installed"
done
# Every file the packages installed, for the purge check (directories are shared).
for pkg in "${packages[@]}"; do dpkg -L "$pkg"; done | while read -r f; do
  [ -d "$f" ] || echo "$f"
done >"$dir/files"

step "installed: user, runtime directory, enabled unit, ldconfig"
getent passwd retryd >/dev/null || die "postinst did not create the user retryd (systemd-sysusers)"
[ "$(stat -c %U:%G /run/retryd 2>/dev/null)" = retryd:retryd ] ||
  die "postinst did not create /run/retryd owned by retryd (systemd-tmpfiles --create)"
[ -L /etc/systemd/system/multi-user.target.wants/retryd.service ] ||
  die "postinst did not enable retryd.service"
ldconfig -p | grep -q "libretryd.so.0 " || die "ldconfig -p does not list libretryd.so.0"

step "retryd --check_config=/etc/retryd/retryd.toml"
retryd --check_config=/etc/retryd/retryd.toml || die "the packaged config does not pass"

step "the daemon from the unit's ExecStart, as user retryd"
unit=/lib/systemd/system/retryd.service
exec_start=$(sed -n 's/^ExecStart=//p' "$unit")
user=$(sed -n 's/^User=//p' "$unit")
group=$(sed -n 's/^Group=//p' "$unit")
[ -n "$exec_start" ] && [ -n "$user" ] && [ -n "$group" ] || die "$unit: no ExecStart, User or Group"
echo "$user:$group: $exec_start"
# shellcheck disable=SC2086  # ExecStart is a command line
setpriv --reuid="$user" --regid="$group" --init-groups -- $exec_start >"$dir/daemon.log" 2>&1 &
daemon=$!
trap 'kill "$daemon" 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  [ -S /run/retryd/retryd.sock ] && break
  kill -0 "$daemon" 2>/dev/null || { cat "$dir/daemon.log"; die "the daemon exited"; }
  sleep 0.1
done
[ -S /run/retryd/retryd.sock ] || { cat "$dir/daemon.log"; die "no socket /run/retryd/retryd.sock"; }
[ "$(stat -c %U /proc/$daemon)" = "$user" ] || die "the daemon does not run as $user"

step "retryctl status"
status=$(retryctl status) || { echo "$status"; die "retryctl status failed"; }
echo "$status" | head -n 1
grep -q "daemon pid $daemon " <<<"$status" || die "retryctl status does not see daemon pid $daemon"

step "a C worker built with pkg-config --cflags --libs retryd"
# shellcheck disable=SC2046
gcc -o "$dir/consumer_c" "$dir/consumer/consumer.c" $(pkg-config --cflags --libs retryd) ||
  die "the C worker does not build with pkg-config"
"$dir/consumer_c" --attached || die "the C worker did not attach to the daemon"

step "a CMake project with find_package(retryd): retryd::retryd and retryd::retryd_static"
cmake -S "$dir/consumer" -B "$dir/consumer-build" >"$dir/cmake.log" 2>&1 &&
  cmake --build "$dir/consumer-build" >>"$dir/cmake.log" 2>&1 ||
  { cat "$dir/cmake.log"; die "the CMake project does not build"; }
"$dir/consumer-build/consumer_shared" --attached || die "consumer_shared did not attach"
"$dir/consumer-build/consumer_static" --attached || die "consumer_static did not attach"
if objdump -p "$dir/consumer-build/consumer_static" | grep -q "NEEDED.*libretryd"; then
  die "consumer_static needs libretryd.so: retryd::retryd_static is not the static library"
fi

step "python3: import retryd; retryd.Client()"
python3 -c '
import retryd
client = retryd.Client()
print("library", retryd.library_path(), "local" if client.local else "attached")
assert retryd.library_path() == "libretryd.so.0", retryd.library_path()
assert not client.local, "the client did not attach to the daemon"
' || die "the Python client did not open on the daemon"

step "stop the daemon"
kill -TERM "$daemon"
wait "$daemon" || true
trap - EXIT

step "apt-get purge ${packages[*]}"
apt-get purge -y -q "${packages[@]}" >"$dir/apt-purge.log" 2>&1 ||
  { cat "$dir/apt-purge.log"; die "apt-get purge failed"; }
left=()
while read -r f; do
  if [ -e "$f" ] || [ -L "$f" ]; then left+=("$f"); fi
done <"$dir/files"
for f in /etc/retryd /usr/lib/python3/dist-packages/retryd /usr/include/retryd \
         /etc/systemd/system/multi-user.target.wants/retryd.service; do
  if [ -e "$f" ] || [ -L "$f" ]; then left+=("$f"); fi
done
[ ${#left[@]} -eq 0 ] || die "left after the purge: ${left[*]}"
if ldconfig -p | grep -q libretryd; then die "ldconfig -p still lists libretryd"; fi
step "done"
