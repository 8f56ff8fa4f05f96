#!/bin/bash
# in_root.sh: run by clean_root.sh as root inside a minimal Debian root with no systemd running.
# Installs the packages in DIR with apt (dependencies from the archive), runs the daemon as the
# unit's ExecStart line says, as the packaged user, uses it from retryctl and from C, CMake,
# Python, Ruby and Lua workers, a clustered Puma, php-fpm and nginx (installed in the root
# beforehand, as on a host that already serves PHP, Ruby and Lua), then purges the packages and
# checks that nothing of them is left.
# Usage: in_root.sh DIR   (DIR holds the .debs, the consumer/ project and apps/)
set -euo pipefail
dir=${1:?"usage: in_root.sh DIR"}
packages=(retryd libretryd0 libretryd-dev python3-retryd ruby-retryd php-retryd lua-retryd)
php_version=8.2
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
  grep -q "install ok installed" <<<"$(dpkg-query -W -f='${Status}' "$pkg")" || die "$pkg not installed"
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
grep -q "libretryd.so.0 " <<<"$(ldconfig -p)" || die "ldconfig -p does not list libretryd.so.0"

step "retryctl --help names the installed JSON schema"
schema=$(retryctl --help | grep -o '/[^ )]*/retryctl-json-schema\.json' || true)
[ -n "$schema" ] || die "retryctl --help names no installed retryctl-json-schema.json"
python3 -m json.tool "$schema" >/dev/null || die "$schema (named by retryctl --help) is not JSON"

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
if grep -q "NEEDED.*libretryd" <<<"$(objdump -p "$dir/consumer-build/consumer_static")"; then
  die "consumer_static needs libretryd.so: retryd::retryd_static is not the static library"
fi

# Each language's client below, as the C and C++ workers above: opening waits at most 20 ms
# for the daemon, and a client it did not answer in time (a loaded machine) attaches on a later
# call; each calls every 50 ms until it is attached, for 30 s at most.
step "python3: import retryd; retryd.Client(); an admission through the C Permit"
python3 -c '
import time
import retryd
client = retryd.Client()
dep = client.dependency("python")
calls, deadline = 0, time.monotonic() + 30
while client.local and time.monotonic() < deadline:
    with dep.admit():
        pass
    calls += 1
    time.sleep(0.05)
print("library", retryd.library_path(), "local" if client.local else "attached",
      f"({calls} calls before)")
assert retryd.library_path() == "libretryd.so.0", retryd.library_path()
assert not client.local, "the client did not attach to the daemon"
with dep.admit() as permit:
    assert type(permit).__module__ == "retryd._speedups", type(permit)
' || die "the Python client did not open on the daemon"

step "ruby: require \"retryd\" from vendor_ruby; gem list; Retryd::Client.new"
version=$(dpkg-query -W -f='${Version}' ruby-retryd)
grep -qxF "retryd ($version)" <<<"$(gem list --local retryd)" ||
  die "gem list does not show retryd ($version): $(gem list --local retryd)"
ruby -e '
  require "retryd"
  client = Retryd::Client.new
  dep = client.dependency("ruby")
  calls = 0
  deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 30
  while client.local? && Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
    dep.admit {}
    calls += 1
    sleep 0.05
  end
  gem = $LOADED_FEATURES.grep(%r{/retryd\.rb\z}).first
  puts "#{gem}: library #{Retryd.library_path}, #{client.local? ? "local" : "attached"} " \
       "(#{calls} calls before)"
  abort "loaded #{gem}, not vendor_ruby" unless gem == "/usr/lib/ruby/vendor_ruby/retryd.rb"
  abort "loaded #{Retryd.library_path}" unless Retryd.library_path == "libretryd.so.0"
  abort "the client did not attach to the daemon" if client.local?
' || die "the Ruby client did not open on the daemon"

step "luajit: require \"retryd\" from /usr/share/lua/5.1; retryd.open()"
luajit -e '
  local ffi = require "ffi"
  ffi.cdef "int poll(void *fds, unsigned long nfds, int timeout);"
  local retryd = require "retryd"
  local client = assert(retryd.open())
  local dep = assert(client:dependency("lua"))
  local calls, deadline = 0, os.time() + 30
  while client:is_local() and os.time() < deadline do
    local permit = dep:admit()
    if permit then permit:complete("success") end
    calls = calls + 1
    ffi.C.poll(nil, 0, 50)
  end
  local module = package.searchpath("retryd", package.path)
  print(module .. ": library " .. retryd.library_path .. ", " ..
        (client:is_local() and "local" or "attached") .. " (" .. calls .. " calls before)")
  assert(module == "/usr/share/lua/5.1/retryd.lua", "loaded " .. module)
  assert(retryd.library_path == "libretryd.so.0", "loaded " .. retryd.library_path)
  assert(not client:is_local(), "the client did not attach to the daemon")
' || die "the Lua client did not open on the daemon"

# The servers below run in sessions of their own (setsid), so that their master and its workers
# or children go together: the master's pid is the process group's.
# stop_server PID NAME: stops the server PID (SIGTERM to its master, which stops its workers;
# after 10 s SIGKILL to the whole group).
stop_server() {
  kill -TERM "$1" 2>/dev/null || return 0
  for _ in $(seq 100); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$1" 2>/dev/null; then echo "$2 did not stop on SIGTERM: killed"; fi
  kill -KILL -- "-$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}
# wait_for_socket PATH PID NAME LOG: until the server PID listens on PATH (30 s at most).
wait_for_socket() {
  for _ in $(seq 300); do
    [ -S "$1" ] && return 0
    kill -0 "$2" 2>/dev/null || { cat "$4"; die "$3 exited"; }
    sleep 0.1
  done
  cat "$4"
  die "$3 does not listen on $1"
}
servers=()
trap 'for p in "${servers[@]}"; do kill -KILL -- "-$p" 2>/dev/null || true; done
      kill "$daemon" 2>/dev/null || true' EXIT
app=$dir/apps

step "puma -w 2 under Bundler (gem \"puma\", gem \"retryd\"): a Rack app admitting through retryd"
# Bundler resolves the Gemfile with the gems Debian's packages installed (--local: no server).
(cd "$app" && bundle lock --local) >"$dir/bundle.log" 2>&1 ||
  { cat "$dir/bundle.log"; die "Bundler does not resolve the Gemfile from the packages' gems"; }
grep -qE "^    retryd \($version\)$" "$app/Gemfile.lock" ||
  die "Gemfile.lock does not lock retryd ($version): $(cat "$app/Gemfile.lock")"
(cd "$app" && exec setsid env BUNDLE_GEMFILE="$app/Gemfile" bundle exec puma --workers 2 \
   --threads 1:1 --preload --environment production --bind "unix://$dir/puma.sock" config.ru) \
  >"$dir/puma.log" 2>&1 &
puma=$!
servers+=("$puma")
wait_for_socket "$dir/puma.sock" "$puma" Puma "$dir/puma.log"
"$app/serve_check.py" puma "$dir/puma.sock" "$puma" 2 clean-root-puma ||
  { cat "$dir/puma.log"; die "Puma's workers did not admit through the daemon"; }
stop_server "$puma" Puma

step "php-fpm (pm = static, 2 children) with the extension the package enabled"
for sapi in cli fpm; do
  link=/etc/php/$php_version/$sapi/conf.d/20-retryd.ini
  [ "$(readlink "$link")" = "/etc/php/$php_version/mods-available/retryd.ini" ] ||
    die "postinst (phpenmod) did not enable retryd for $sapi: no $link"
done
grep -qx retryd <<<"$(php -m)" || die "php -m does not list retryd"
grep -qx retryd <<<"$("php-fpm$php_version" -m)" || die "php-fpm$php_version -m does not list retryd"
# A pool of its own in a temporary directory; php.ini and conf.d are the fpm SAPI's, so the
# extension is the one /etc/php/8.2/fpm/conf.d/20-retryd.ini loads. Its children run as
# www-data, as Debian's own pool's do, which the packaged config lets in once it is in the
# socket's group (docs/PACKAGING.md): without that, each request fails with "permission denied".
usermod -aG retryd www-data
printf '%s\n' "[global]" "pid = $dir/php-fpm.pid" "error_log = $dir/php-fpm.log" \
  "daemonize = no" "[app]" "user = www-data" "group = www-data" \
  "listen = $dir/php-fpm.sock" "pm = static" "pm.max_children = 2" \
  "catch_workers_output = yes" >"$dir/php-fpm.conf"
setsid "php-fpm$php_version" --nodaemonize --fpm-config "$dir/php-fpm.conf" \
  >"$dir/php-fpm.out" 2>&1 &
fpm=$!
servers+=("$fpm")
wait_for_socket "$dir/php-fpm.sock" "$fpm" php-fpm "$dir/php-fpm.out"
"$app/serve_check.py" fpm "$dir/php-fpm.sock" "$app/fpm_app.php" "$fpm" 2 clean-root-fpm ||
  { cat "$dir/php-fpm.out" "$dir/php-fpm.log"
    die "php-fpm's children did not admit through the daemon"; }
stop_server "$fpm" php-fpm

step "nginx (2 workers) with the packaged Lua module: a location admitting through retryd"
# The Lua module loaded Debian's way (modules-enabled/), and no lua_package_path for retryd:
# nginx finds /usr/share/lua/5.1/retryd.lua by default. The workers run as www-data, in the
# socket's group (above); the master as root, as under Debian's unit.
nginx_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')
printf '%s\n' "worker_processes 2;" "daemon off;" "user www-data www-data;" \
  "pid $dir/nginx.pid;" "error_log $dir/nginx-error.log warn;" \
  "include /etc/nginx/modules-enabled/*.conf;" "events { worker_connections 64; }" \
  "http {" "  access_log off;" "  lua_package_path \"$app/?.lua;;\";" \
  "  init_worker_by_lua_block { require(\"nginx_app\").init_worker() }" \
  "  server {" "    listen 127.0.0.1:$nginx_port reuseport;" \
  "    location / { content_by_lua_block { require(\"nginx_app\").serve() } }" \
  "  }" "}" >"$dir/nginx.conf"
setsid nginx -c "$dir/nginx.conf" -e "$dir/nginx-error.log" >"$dir/nginx.out" 2>&1 &
nginx=$!
servers+=("$nginx")
for _ in $(seq 300); do
  [ -s "$dir/nginx.pid" ] && python3 -c 'import socket, sys
socket.create_connection(("127.0.0.1", int(sys.argv[1])), 1)' "$nginx_port" 2>/dev/null && break
  kill -0 "$nginx" 2>/dev/null ||
    { cat "$dir/nginx.out" "$dir/nginx-error.log"; die "nginx exited"; }
  sleep 0.1
done
"$app/serve_check.py" nginx "127.0.0.1:$nginx_port" "$nginx" 2 clean-root-nginx ||
  { cat "$dir/nginx.out" "$dir/nginx-error.log"
    die "nginx's workers did not admit through the daemon"; }
kill -QUIT "$nginx"
wait "$nginx" || die "nginx did not stop cleanly on SIGQUIT"
# The workers' stderr is the error log: a line of the library's would be there too.
if grep -qv '\[notice\]' "$dir/nginx-error.log"; then
  cat "$dir/nginx-error.log"
  die "nginx's error log has warnings, errors or lines of the library"
fi

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
         /etc/systemd/system/multi-user.target.wants/retryd.service /usr/share/retryd \
         /usr/lib/ruby/vendor_ruby/retryd "/etc/php/$php_version/mods-available/retryd.ini" \
         /usr/share/lua/5.1/retryd.lua /usr/share/lua/5.1/retryd \
         /etc/php/*/*/conf.d/*retryd.ini /var/lib/php/modules/*/*/*/retryd; do
  if [ -e "$f" ] || [ -L "$f" ]; then left+=("$f"); fi
done
[ ${#left[@]} -eq 0 ] || die "left after the purge: ${left[*]}"
if grep -q libretryd <<<"$(ldconfig -p)"; then die "ldconfig -p still lists libretryd"; fi
if grep -q "^retryd " <<<"$(gem list --local retryd)"; then die "gem list still shows retryd"; fi
if grep -qx retryd <<<"$(php -m)"; then die "php -m still lists retryd"; fi
step "done"
