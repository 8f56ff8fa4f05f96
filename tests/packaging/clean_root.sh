#!/usr/bin/env bash
# clean_root.sh: the packages that check_packages.sh built, on a clean Debian 12 host: the
# minimal root minimal_root.sh made (its path in ROOT_OUT_DIR/root.path), where in_root.sh runs
# as root under chroot, in a mount namespace of its own (/proc, /sys, the host's /dev, and a
# /dev/shm of its own): apt-get install of the packages, the daemon, retryctl, C, CMake, Python,
# Ruby and Lua workers, a clustered Puma, php-fpm and nginx, and the purge. The root is removed
# at the end, whatever the outcome: it serves one run.
# Usage: clean_root.sh SOURCE_DIR DEBS_DIR ROOT_OUT_DIR
set -euo pipefail
src=${1:?"usage: clean_root.sh SOURCE_DIR DEBS_DIR ROOT_OUT_DIR"}
debs=${2:?"usage: clean_root.sh SOURCE_DIR DEBS_DIR ROOT_OUT_DIR"}
out=${3:?"usage: clean_root.sh SOURCE_DIR DEBS_DIR ROOT_OUT_DIR"}

[ -f "$out/root.path" ] ||
  { echo "clean_root.sh: no $out/root.path (made by the test packaging_root)" >&2; exit 1; }
root=$(cat "$out/root.path")
[ -x "$root/usr/bin/apt-get" ] ||
  { echo "clean_root.sh: $root (named by $out/root.path) is no Debian root" >&2; exit 1; }
trap '"$src/tests/packaging/minimal_root.sh" --remove "$out"' EXIT

version=$(sed -nE 's/^project\(retryd VERSION ([0-9.]+).*/\1/p' "$src/CMakeLists.txt")
arch=$(dpkg-architecture -qDEB_HOST_ARCH)
wanted=("retryd_${version}_$arch.deb" "libretryd0_${version}_$arch.deb"
        "libretryd-dev_${version}_$arch.deb" "python3-retryd_${version}_$arch.deb"
        "ruby-retryd_${version}_all.deb" "php-retryd_${version}_$arch.deb"
        "lua-retryd_${version}_all.deb")
stage=$root/tmp/retryd-test
rm -rf "$stage"
mkdir -p "$stage"
for deb in "${wanted[@]}"; do
  [ -f "$debs/$deb" ] ||
    { echo "clean_root.sh: no $debs/$deb (built by the test packaging_debs)" >&2; exit 1; }
  cp "$debs/$deb" "$stage/"
done
cp -r "$src/tests/packaging/consumer" "$stage/consumer"
cp -r "$src/tests/packaging/apps" "$stage/apps"
cp "$src/tests/packaging/in_root.sh" "$stage/"
# The root's apt reaches the archive for the packages' dependencies by the host's resolver.
cp -L /etc/resolv.conf "$root/etc/resolv.conf"

start=$(date +%s)
echo "=== in_root.sh in $root"
# The test runs with an environment of its own: nothing of ctest's or of this host's. The
# mounts go with the namespace when in_root.sh ends.
# shellcheck disable=SC2016  # expanded by the inner shell
unshare --mount --fork bash -c '
  set -e
  mount --make-rprivate /
  mount -t proc proc "$1/proc"
  mount -t sysfs sysfs "$1/sys"
  mount --rbind /dev "$1/dev"
  mount -t tmpfs -o mode=1777 tmpfs "$1/dev/shm"
  exec chroot "$1" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
    /tmp/retryd-test/in_root.sh /tmp/retryd-test
' clean_root "$root"
echo "=== clean root passed in $(($(date +%s) - start))s"
