#!/usr/bin/env bash
# clean_root.sh: the packages that check_packages.sh built, on a clean Debian 12 host. mmdebstrap
# makes a minimal root (apt, plus g++, cmake and pkgconf to build workers with, php8.2-fpm,
# libfcgi-bin's cgi-fcgi, puma and bundler to serve PHP and Ruby with) in a temporary directory
# and runs in_root.sh in it, as root under chroot: apt-get install of the packages, the daemon,
# retryctl, C, CMake, Python and Ruby workers, a clustered Puma and php-fpm, and the purge.
# Nothing is cached: the root and everything downloaded go with the temporary directory.
# Usage: clean_root.sh SOURCE_DIR DEBS_DIR
# The archive: $RETRYD_DEBIAN_MIRROR (default http://deb.debian.org/debian) and
# $RETRYD_DEBIAN_SECURITY (default http://deb.debian.org/debian-security).
set -euo pipefail
src=${1:?"usage: clean_root.sh SOURCE_DIR DEBS_DIR"}
debs=${2:?"usage: clean_root.sh SOURCE_DIR DEBS_DIR"}
mirror=${RETRYD_DEBIAN_MIRROR:-http://deb.debian.org/debian}
security=${RETRYD_DEBIAN_SECURITY:-http://deb.debian.org/debian-security}

source "$src/scripts/lib/deps.sh"
retryd_install_deps mmdebstrap

version=$(sed -nE 's/^project\(retryd VERSION ([0-9.]+).*/\1/p' "$src/CMakeLists.txt")
arch=$(dpkg-architecture -qDEB_HOST_ARCH)
wanted=("retryd_${version}_$arch.deb" "libretryd0_${version}_$arch.deb"
        "libretryd-dev_${version}_$arch.deb" "python3-retryd_${version}_all.deb"
        "ruby-retryd_${version}_all.deb" "php-retryd_${version}_$arch.deb")
work=$(mktemp -d /tmp/retryd-clean-root-XXXXXX)
chmod 0755 "$work"  # apt downloads as its own user, _apt
trap 'rm -rf "$work"' EXIT
stage=$work/stage
mkdir -p "$stage"
for deb in "${wanted[@]}"; do
  [ -f "$debs/$deb" ] ||
    { echo "clean_root.sh: no $debs/$deb (built by the test packaging_debs)" >&2; exit 1; }
  cp "$debs/$deb" "$stage/"
done
cp -r "$src/tests/packaging/consumer" "$stage/consumer"
cp -r "$src/tests/packaging/apps" "$stage/apps"
cp "$src/tests/packaging/in_root.sh" "$stage/"

start=$(date +%s)
export RETRYD_ROOT_START=$start
echo "=== mmdebstrap bookworm ($mirror, $security) in $work"
# The test runs with an environment of its own: nothing of ctest's or of this host's.
in_root='env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root /tmp/retryd-test/in_root.sh'
# force-unsafe-io: dpkg does not sync each file it unpacks, which a root thrown away at the end
# never needs (10 s less of the 80 s the root takes here).
# shellcheck disable=SC2016  # the hooks' $1 is the root, expanded by mmdebstrap's shell
TMPDIR=$work mmdebstrap --mode=root --variant=apt --dpkgopt=force-unsafe-io \
  --include=g++,cmake,make,pkgconf,php8.2-fpm,libfcgi-bin,puma,bundler \
  --customize-hook='echo "--- minimal root: $(($(date +%s) - RETRYD_ROOT_START))s"' \
  --customize-hook='mkdir -p "$1/tmp/retryd-test"' \
  --customize-hook="sync-in $stage /tmp/retryd-test" \
  --customize-hook="chroot \"\$1\" $in_root /tmp/retryd-test" \
  bookworm /dev/null \
  "deb $mirror bookworm main" "deb $mirror bookworm-updates main" \
  "deb $security bookworm-security main"
echo "=== clean root passed in $(($(date +%s) - start))s"
