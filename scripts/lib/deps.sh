# scripts/lib/deps.sh: the Debian packages retryd builds, tests and demos with, installed only
# when missing. Sourced by scripts/test and scripts/demo.

# The packages every build needs.
RETRYD_DEPS=(
  cmake ninja-build g++ pkg-config
  libboost-dev libgflags-dev libgoogle-glog-dev libgtest-dev libgmock-dev libbenchmark-dev
  libtomlplusplus-dev nlohmann-json3-dev libsystemd-dev libcurl4-openssl-dev libhiredis-dev
  python3 python3-pytest
)

# retryd_install_deps [extra packages...]: installs whatever of RETRYD_DEPS and the extras is
# missing, quietly, as root or through sudo. Runs `apt-get update` only if something is missing.
retryd_install_deps() {
  local want=("${RETRYD_DEPS[@]}" "$@") missing=() pkg
  # One dpkg-query for all of them: each reads the whole package database (scripts/test's 73
  # names took 3.8 s one at a time, 0.06 s at once). Installed: "ok installed", whatever the
  # package is selected for (install, hold, deinstall); by its name and by its name with its
  # architecture (libc6:amd64).
  local -A installed=()
  while read -r pkg; do installed[$pkg]=1; done < <(
    dpkg-query -W -f='${Package} ${binary:Package} ${Status}\n' "${want[@]}" 2>/dev/null |
      awk '$4 == "ok" && $5 == "installed" { print $1; print $2 }')
  for pkg in "${want[@]}"; do
    [ -z "$pkg" ] || [ -n "${installed[$pkg]:-}" ] || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "need root or sudo to install: ${missing[*]}" >&2; return 1; }
    sudo=(sudo)
  fi
  echo "installing: ${missing[*]}"
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
  # Some of these packages ship a service (prometheus, installed for its promtool; php-fpm and
  # nginx, which the bindings' tests start on their own configs): none is started by this install
  # (policy-rc.d, as in container images), and none is left enabled.
  local policy=/usr/sbin/policy-rc.d ours=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null &&
      "${sudo[@]}" chmod 0755 "$policy" && ours=1
  fi
  local rc=0
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null || rc=$?
  [ "$ours" = 1 ] && "${sudo[@]}" rm -f "$policy"
  local unit
  for pkg in "${missing[@]}"; do
    case "$pkg" in
      prometheus) unit=prometheus.service ;;
      nginx) unit=nginx.service ;;
      php-fpm) unit=$(systemctl list-unit-files 'php*-fpm.service' --no-legend 2>/dev/null |
                      awk '{ print $1; exit }') ;;
      *) continue ;;
    esac
    if [ -n "$unit" ] && command -v systemctl >/dev/null; then
      "${sudo[@]}" systemctl disable --quiet "$unit" 2>/dev/null || true
    fi
  done
  return "$rc"
}
