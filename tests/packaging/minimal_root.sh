#!/usr/bin/env bash
# minimal_root.sh: the clean Debian 12 host that clean_root.sh installs the packages on. mmdebstrap
# makes a minimal root (apt, plus g++, cmake and pkgconf to build workers with, php8.2-fpm,
# libfcgi-bin's cgi-fcgi, puma and bundler to serve PHP and Ruby with, nginx with its Lua module
# and luajit2 to serve and run Lua with) from the archive, in a directory of its own under /tmp
# (apt downloads as its own user, _apt, who may not enter the build tree), and writes that
# directory's path to OUT_DIR/root.path. It needs nothing of the packages, so it runs while
# packaging_debs builds them. Nothing is cached: clean_root.sh removes the root once it has used
# it, and --remove (the suite's cleanup) removes one left over.
# Usage: minimal_root.sh SOURCE_DIR OUT_DIR
#        minimal_root.sh --remove OUT_DIR
# The archive: $RETRYD_DEBIAN_MIRROR (default http://deb.debian.org/debian) and
# $RETRYD_DEBIAN_SECURITY (default http://deb.debian.org/debian-security).
set -euo pipefail

# remove_root OUT_DIR: removes the root OUT_DIR/root.path names, if any.
remove_root() {
  local path=$1/root.path root
  [ -f "$path" ] || return 0
  root=$(cat "$path")
  case "$root" in /tmp/retryd-root-*/root) rm -rf "$(dirname "$root")" ;; esac
  rm -f "$path"
}

if [ "${1:-}" = "--remove" ]; then
  remove_root "${2:?"usage: minimal_root.sh --remove OUT_DIR"}"
  exit 0
fi
src=${1:?"usage: minimal_root.sh SOURCE_DIR OUT_DIR"}
out=${2:?"usage: minimal_root.sh SOURCE_DIR OUT_DIR"}
mirror=${RETRYD_DEBIAN_MIRROR:-http://deb.debian.org/debian}
security=${RETRYD_DEBIAN_SECURITY:-http://deb.debian.org/debian-security}

source "$src/scripts/lib/deps.sh"
retryd_install_deps mmdebstrap

mkdir -p "$out"
remove_root "$out"
work=$(mktemp -d /tmp/retryd-root-XXXXXX)
chmod 0755 "$work"
root=$work/root
start=$(date +%s)
echo "=== mmdebstrap bookworm ($mirror, $security) into $root"
# force-unsafe-io: dpkg does not sync each file it unpacks, which a root thrown away after one
# use never needs. The package lists stay, for the apt-get install of the packages in the root.
if ! TMPDIR=$work mmdebstrap --mode=root --variant=apt --dpkgopt=force-unsafe-io \
     --skip=cleanup/apt/lists \
     --include=g++,cmake,make,pkgconf,php8.2-fpm,libfcgi-bin,puma,bundler \
     --include=nginx,libnginx-mod-http-lua,luajit2 \
     bookworm "$root" \
     "deb $mirror bookworm main" "deb $mirror bookworm-updates main" \
     "deb $security bookworm-security main"; then
  rm -rf "$work"
  echo "minimal_root.sh: mmdebstrap failed (output above)" >&2
  exit 1
fi
echo "$root" >"$out/root.path"
echo "=== minimal root in $(($(date +%s) - start))s: $root"
