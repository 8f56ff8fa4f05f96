#!/usr/bin/env bash
# check_packages.sh: build the Debian packages with scripts/package into OUT_DIR and check
# them: lintian clean (scripts/package's own verdict), the files each package holds, the
# Depends computed from the binaries, the maintainer scripts and triggers, and, from the
# unpacked packages, a CMake project linking both libraries, the Python module, the Ruby
# library and the Lua module loading the library by its soname, and PHP loading the extension.
# Every check runs; the failures are listed at the end.
# Usage: check_packages.sh SOURCE_DIR OUT_DIR
set -uo pipefail
src=${1:?"usage: check_packages.sh SOURCE_DIR OUT_DIR"}
out=${2:?"usage: check_packages.sh SOURCE_DIR OUT_DIR"}
failures=()
fail() { failures+=("$*"); echo "FAIL: $*"; }
finish() {
  echo "=== done in ${SECONDS}s"
  if [ ${#failures[@]} -gt 0 ]; then
    printf 'FAILED (%d):\n' "${#failures[@]}"
    printf '  %s\n' "${failures[@]}"
    exit 1
  fi
  echo "all package checks passed"
}
step() { echo "=== $* (at ${SECONDS}s)"; }

step "scripts/package --out $out"
rm -rf "$out"
mkdir -p "$out"
# Under CI, GCC's warnings with Debian's flags are errors: the suite's other builds are clang's.
# Without debug information (-g0, no -dbgsym packages), which no check here reads: a third
# less compile time.
werror=OFF
[ -z "${CI:-}" ] || werror=ON
if ! RETRYD_WERROR=$werror DEB_BUILD_OPTIONS="noddebs ${DEB_BUILD_OPTIONS:-}" \
     DEB_CFLAGS_APPEND=-g0 DEB_CXXFLAGS_APPEND=-g0 "$src/scripts/package" --out "$out"; then
  fail "scripts/package failed: the build, or lintian errors or warnings (output above)"
fi

version=$(sed -nE 's/^project\(retryd VERSION ([0-9.]+).*/\1/p' "$src/CMakeLists.txt")
arch=$(dpkg-architecture -qDEB_HOST_ARCH)
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
libdir=usr/lib/$multiarch
# The PHP the extension was built for (scripts/package installed php-dev): its extension
# directory (/usr/lib/php/20220829 on Debian 12), API and version (8.2).
php_extdir=$(php-config --extension-dir)
php_extdir=${php_extdir#/}
php_api=$(php-config --phpapi)
php_version=$(php-config --version | sed -E 's/^([0-9]+\.[0-9]+).*/\1/')
vendor_ruby=usr/lib/ruby/vendor_ruby
gemspec=usr/share/rubygems-integration/all/specifications/retryd-$version.gemspec
declare -A deb=(
  [retryd]=$out/retryd_${version}_$arch.deb
  [libretryd0]=$out/libretryd0_${version}_$arch.deb
  [libretryd-dev]=$out/libretryd-dev_${version}_$arch.deb
  [python3-retryd]=$out/python3-retryd_${version}_$arch.deb
  [ruby-retryd]=$out/ruby-retryd_${version}_all.deb
  [php-retryd]=$out/php-retryd_${version}_$arch.deb
  [lua-retryd]=$out/lua-retryd_${version}_all.deb
)
for pkg in "${!deb[@]}"; do
  if [ ! -f "${deb[$pkg]}" ]; then
    fail "$pkg: no ${deb[$pkg]}"
    finish
  fi
done

work=$(mktemp -d /tmp/retryd-check-packages-XXXXXX)
trap 'rm -rf "$work"' EXIT

# contents PKG: "path" or "path -> target" per line, without ./ and directories.
contents() {
  dpkg-deb -c "${deb[$1]}" | awk '$1 !~ /^d/ { $1=$2=$3=$4=$5=""; sub(/^ +\.\//, ""); print }'
}
# expect PKG LINE...: each line is in PKG's contents.
expect() {
  local pkg=$1 line list
  shift
  list=$(contents "$pkg")
  for line in "$@"; do
    grep -qxF -- "$line" <<<"$list" || fail "$pkg: does not hold '$line'"
  done
}
# expect_none PKG REGEX: no path in PKG's contents matches.
expect_none() {
  local hits
  hits=$(contents "$1" | sed 's/ -> .*//' | grep -E -- "$2")
  [ -z "$hits" ] || fail "$1: holds what belongs elsewhere: $(tr '\n' ' ' <<<"$hits")"
}
# control PKG FILE: the control file FILE (control, conffiles, postinst, ...) of PKG.
control() {
  local dir=$work/control-$1
  [ -d "$dir" ] || dpkg-deb -e "${deb[$1]}" "$dir"
  cat "$dir/$2" 2>/dev/null
}
# expect_in PKG FILE TEXT...: each TEXT is in PKG's control file FILE.
expect_in() {
  local pkg=$1 file=$2 text body
  shift 2
  body=$(control "$pkg" "$file")
  [ -n "$body" ] || { fail "$pkg: no control file '$file'"; return; }
  for text in "$@"; do
    grep -qF -- "$text" <<<"$body" || fail "$pkg: $file lacks '$text'"
  done
}

step "file lists"
expect retryd usr/sbin/retryd usr/bin/retryctl lib/systemd/system/retryd.service \
  etc/retryd/retryd.toml usr/lib/sysusers.d/retryd.conf usr/lib/tmpfiles.d/retryd.conf \
  usr/share/man/man8/retryd.8.gz usr/share/man/man1/retryctl.1.gz \
  usr/share/retryd/retryctl-json-schema.json
expect_none retryd "libretryd|^usr/include/|python3|ruby|php"
expect libretryd0 "$libdir/libretryd.so.$version" "$libdir/libretryd.so.0 -> libretryd.so.$version"
expect_none libretryd0 "^usr/include/|libretryd\.a$|libretryd\.so( |$)|^usr/s?bin/"
headers=()
for h in "$src"/client/include/retryd/*.h; do headers+=("usr/include/retryd/$(basename "$h")"); done
expect libretryd-dev "${headers[@]}" "$libdir/libretryd.so -> libretryd.so.0" \
  "$libdir/libretryd.a" "$libdir/pkgconfig/retryd.pc" \
  "$libdir/cmake/retryd/retrydConfig.cmake" "$libdir/cmake/retryd/retrydConfigVersion.cmake" \
  "$libdir/cmake/retryd/retrydTargets.cmake"
expect_none libretryd-dev "libretryd\.so\.|^usr/s?bin/"
pyext=usr/lib/python3/dist-packages/retryd/_speedups.abi3.so
modules=("$pyext")
for m in "$src"/bindings/python/retryd/*.py; do
  modules+=("usr/lib/python3/dist-packages/retryd/$(basename "$m")")
done
expect python3-retryd "${modules[@]}"
expect_none python3-retryd "libretryd|\.c$|ruby|php"
rb_files=("$vendor_ruby/retryd.rb")
for f in "$src"/bindings/ruby/lib/retryd/*.rb; do
  rb_files+=("$vendor_ruby/retryd/$(basename "$f")")
done
expect ruby-retryd "${rb_files[@]}" "$gemspec"
expect_none ruby-retryd "\.so|^etc/|python3|php"
expect php-retryd "$php_extdir/retryd.so" "etc/php/$php_version/mods-available/retryd.ini"
expect_none php-retryd "libretryd|^usr/include/|python3|ruby|^etc/php/[^/]+/[^m]"
# The Lua module where LuaJIT's and nginx's Lua module's default path looks: /usr/share/lua/5.1.
lua_dir=usr/share/lua/5.1
lua_files=("$lua_dir/retryd.lua")
for f in "$src"/bindings/lua/retryd/*.lua; do lua_files+=("$lua_dir/retryd/$(basename "$f")"); done
expect lua-retryd "${lua_files[@]}"
expect_none lua-retryd "\.so|^etc/|python3|ruby|php|/tests?/|/bench/"

step "control files and maintainer scripts"
expect_in retryd conffiles /etc/retryd/retryd.toml
# The daemon's and retryctl's shared libraries, each mapped to the package that holds it on
# this build host, must all be in Depends (computed by ${shlibs:Depends}).
depends=$(dpkg-deb -f "${deb[retryd]}" Depends)
echo "retryd Depends: $depends"
depends_names=$(tr ',|' '\n\n' <<<"$depends" | sed -E 's/^ *([^ ]+).*/\1/')
# owner PATH: the package holding the library PATH (as ldconfig names it, or the file it
# resolves to, under /usr or not: merged /usr has both).
owner() {
  local p
  for p in "$1" "$(readlink -f "$1")" "/usr$1" "${1#/usr}"; do
    dpkg -S "$p" 2>/dev/null | grep -v '^diversion' | head -n 1 | cut -d: -f1 | grep . && return
  done
}
dpkg-deb -x "${deb[retryd]}" "$work/retryd"
for bin in usr/sbin/retryd usr/bin/retryctl; do
  for soname in $(objdump -p "$work/retryd/$bin" | awk '$1 == "NEEDED" { print $2 }'); do
    path=$(ldconfig -p | awk -v s="$soname" '$1 == s { print $NF; exit }')
    pkg=$(owner "$path")
    if [ -z "$pkg" ]; then
      fail "$bin: needs $soname ($path), which no installed package holds on this host"
    elif ! grep -qxF -- "$pkg" <<<"$depends_names"; then
      fail "retryd: $bin needs $soname (package $pkg), not in Depends: $depends"
    fi
  done
done
grep -q "libtomlplusplus3" <<<"$depends" || fail "retryd: Depends lacks libtomlplusplus3"
grep -q "libhiredis" <<<"$depends" || fail "retryd: Depends lacks libhiredis (the fleet's Redis client)"
# Enabled on install, started where systemd runs, restarted (not stopped) on upgrade, stopped
# on removal, enable link removed on purge.
expect_in retryd postinst "systemd-sysusers" "retryd.conf" "systemd-tmpfiles" \
  "deb-systemd-helper enable 'retryd.service'" "_dh_action=restart" \
  "deb-systemd-invoke \$_dh_action 'retryd.service'"
expect_in retryd prerm '[ "$1" = remove ]' "deb-systemd-invoke stop 'retryd.service'"
expect_in retryd postrm "deb-systemd-helper purge 'retryd.service'"
expect_in libretryd0 triggers "activate-noawait ldconfig"
expect_in libretryd0 shlibs "libretryd 0 libretryd0 (>= "
grep -q "libc6" <<<"$(dpkg-deb -f "${deb[libretryd0]}" Depends)" ||
  fail "libretryd0: Depends lacks libc6: $(dpkg-deb -f "${deb[libretryd0]}" Depends)"
grep -q "libretryd0 (= $version)" <<<"$(dpkg-deb -f "${deb[libretryd-dev]}" Depends)" ||
  fail "libretryd-dev: Depends lacks 'libretryd0 (= $version)'"
grep -q "libretryd0" <<<"$(dpkg-deb -f "${deb[python3-retryd]}" Depends)" ||
  fail "python3-retryd: Depends lacks libretryd0"
# depends_on PKG TEXT...: each TEXT is one of PKG's Depends, whole (a package name, or a name
# with its version), as an entry or an alternative: "ruby" is not found in "ruby-ffi".
depends_on() {
  local pkg=$1 text depends entries
  shift
  depends=$(dpkg-deb -f "${deb[$pkg]}" Depends)
  entries=$(tr ',|' '\n\n' <<<"$depends" | sed -E 's/^ +//; s/ +$//')
  for text in "$@"; do
    grep -qE -- "^$(sed 's/[][().*^$+?{}\\]/\\&/g' <<<"$text")( |$)" <<<"$entries" ||
      fail "$pkg: Depends lacks '$text': $depends"
  done
}
depends_on ruby-retryd "libretryd0 (>= $version)" ruby-ffi "ruby"
# The Python extension's ${shlibs:Depends} (libc6: it links no libretryd, which the module
# loads at run time: the Depends above) and ${python3:Depends}.
depends_on python3-retryd "libretryd0 (>= $version)" libc6 python3
# The FFI is LuaJIT's: OpenResty's (nginx's Lua module links it) or LuaJIT's own.
depends_on lua-retryd "libretryd0 (>= $version)" libluajit2-5.1-2 libluajit-5.1-2
# ${php:Depends}: the PHP API the extension was built for and php-common (phpenmod, phpquery);
# ${shlibs:Depends}: libretryd0, from debian/libretryd0.shlibs.
depends_on php-retryd "phpapi-$php_api" "php-common" "libretryd0"
# The ini is a conffile, enabled for every SAPI on install (php_invoke enmod: phpenmod, from
# php-common's php-maintscript-helper; plain phpenmod without the helper), disabled on removal
# (php_invoke dismod: phpdismod), its conf.d links removed on purge.
expect_in php-retryd conffiles "/etc/php/$php_version/mods-available/retryd.ini"
expect_in php-retryd postinst "php_invoke enmod \"\$version\" ALL \"\$name\"" 'phpenmod "$name"' \
  "for name in retryd"
expect_in php-retryd prerm '[ "$1" = "upgrade" ]' "php_invoke dismod"
expect_in php-retryd postrm '[ "$1" = "remove" ]' "php_invoke dismod \"\$version\" ALL \"\$name\"" \
  '[ "$1" = "purge" ]' 'inifile="${name}.ini"' 'rm -f /var/lib/php/modules/*/*/*/retryd'
for pkg in "${!deb[@]}"; do
  desc=$(dpkg-deb -f "${deb[$pkg]}" Description | tail -n +2)
  [ -n "$desc" ] || fail "$pkg: empty extended description"
done

step "configured paths"
unit=$(cat "$work/retryd/lib/systemd/system/retryd.service")
grep -qxF "ExecStart=/usr/sbin/retryd --config=/etc/retryd/retryd.toml" <<<"$unit" ||
  fail "retryd.service: ExecStart does not run /usr/sbin/retryd --config=/etc/retryd/retryd.toml"
# retryctl --help names the JSON schema where the package installs it, on the --json option's
# second line.
help=$("$work/retryd/usr/bin/retryctl" --help 2>&1)
grep -A1 -- "--json  " <<<"$help" | grep -qE "^ +/usr/share/retryd/retryctl-json-schema\.json\)$" ||
  fail "retryctl --help does not name /usr/share/retryd/retryctl-json-schema.json under --json:" \
       "$(grep -A1 -- "--json  " <<<"$help")"
cmp -s "$work/retryd/usr/share/retryd/retryctl-json-schema.json" \
  "$src/docs/retryctl-json-schema.json" ||
  fail "retryd: /usr/share/retryd/retryctl-json-schema.json is not docs/retryctl-json-schema.json"
root=$work/root
for pkg in libretryd0 libretryd-dev python3-retryd ruby-retryd php-retryd lua-retryd; do
  dpkg-deb -x "${deb[$pkg]}" "$root"
done
pc=$(cat "$root/$libdir/pkgconfig/retryd.pc")
grep -qxF "prefix=/usr" <<<"$pc" || fail "retryd.pc: not prefix=/usr: $(head -n 1 <<<"$pc")"
grep -qxF "libdir=\${prefix}/lib/$multiarch" <<<"$pc" ||
  fail "retryd.pc: libdir is not \${prefix}/lib/$multiarch"

step "find_package(retryd) from the unpacked libretryd-dev"
if cmake -S "$src/tests/packaging/consumer" -B "$work/consumer" \
     -DCMAKE_PREFIX_PATH="$root/usr" >"$work/consumer.log" 2>&1 &&
   cmake --build "$work/consumer" >>"$work/consumer.log" 2>&1; then
  LD_LIBRARY_PATH=$root/$libdir "$work/consumer/consumer_shared" ||
    fail "consumer_shared (retryd::retryd) does not run"
  "$work/consumer/consumer_static" || fail "consumer_static (retryd::retryd_static) does not run"
  if grep -q "NEEDED.*libretryd" <<<"$(objdump -p "$work/consumer/consumer_static")"; then
    fail "consumer_static needs libretryd.so: retryd::retryd_static is not the static library"
  fi
else
  cat "$work/consumer.log"
  fail "the CMake project of tests/packaging/consumer does not build against libretryd-dev"
fi

step "the Python module loads libretryd by its soname, and admits through its C Permit"
soname=$(objdump -p "$root/$libdir/libretryd.so.$version" | awk '$1 == "SONAME" { print $2 }')
loaded=$(env -u RETRYD_LIBRARY -u RETRYD_PYTHON_EXTENSION -u RETRYD_PYTHON_PURE \
  -u RETRYD_SOCKET -u RETRYD_SEGMENT LD_LIBRARY_PATH="$root/$libdir" \
  PYTHONPATH="$root/usr/lib/python3/dist-packages" PYTHONDONTWRITEBYTECODE=1 \
  python3 -c 'import retryd
client = retryd.Client(segment="retryd-check-packages-none")
with client.dependency("check").admit() as permit:
    print(retryd.library_path(), type(permit).__module__)' 2>"$work/python.err")
[ "$loaded" = "$soname retryd._speedups" ] ||
  fail "python3-retryd: loaded '$loaded', not the library's soname '$soname' and the C Permit:" \
       "$(cat "$work/python.err")"
dynamic=$(objdump -p "$root/$pyext")
if grep -qE "^ *(RPATH|RUNPATH) |^ *NEEDED +libretryd" <<<"$dynamic"; then
  fail "python3-retryd: _speedups.abi3.so links libretryd or has an RPATH:" \
       "$(grep -E "^ *(RPATH|RUNPATH|NEEDED) " <<<"$dynamic")"
fi

step "the Ruby library loads from vendor_ruby and libretryd by its soname; its gemspec"
# RUBYLIB stands for vendor_ruby, which is on Ruby's load path where the package is installed.
# shellcheck disable=SC2016  # Ruby's globals
loaded=$(env -u RETRYD_LIBRARY LD_LIBRARY_PATH="$root/$libdir" RUBYLIB="$root/$vendor_ruby" \
  ruby -e 'require "retryd"
           puts $LOADED_FEATURES.grep(%r{/retryd\.rb\z}).first, Retryd.library_path' 2>&1)
[ "$loaded" = "$(printf '%s\n%s' "$root/$vendor_ruby/retryd.rb" "$soname")" ] ||
  fail "ruby-retryd: did not load $vendor_ruby/retryd.rb and '$soname': $loaded"
# The gemspec RubyGems reads: the gem retryd at the project's version, its license, its lib
# path and its one dependency, ffi (ruby-ffi's gem). GEM_PATH ending in ':' keeps the
# system's gem directories (ruby-ffi's) after the unpacked package's.
spec=$(ruby -e 'spec = Gem::Specification.load(ARGV[0]) or abort("does not load")
                puts spec.full_name, spec.licenses.join(","), spec.require_paths.join(","),
                     spec.runtime_dependencies.map(&:name).join(",")' "$root/$gemspec" 2>&1)
[ "$spec" = "$(printf '%s\n' "retryd-$version" Apache-2.0 lib ffi)" ] ||
  fail "ruby-retryd: $gemspec is not retryd-$version, Apache-2.0, lib, ffi: $spec"
gems=$(GEM_PATH="$root/usr/share/rubygems-integration/all:" gem list --local retryd 2>&1)
grep -qxF "retryd ($version)" <<<"$gems" ||
  fail "ruby-retryd: gem list does not show retryd ($version): $gems"
activated=$(env -u RETRYD_LIBRARY GEM_PATH="$root/usr/share/rubygems-integration/all:" \
  RUBYLIB="$root/$vendor_ruby" ruby -e 'gem "retryd"; require "retryd"
                                         puts Gem.loaded_specs["retryd"].version' 2>&1)
[ "$activated" = "$version" ] || fail "ruby-retryd: gem \"retryd\" does not activate: $activated"

step "the Lua module loads in LuaJIT from /usr/share/lua/5.1, and libretryd by its soname"
# LUA_PATH stands for /usr/share/lua/5.1, which is on LuaJIT's default path: checked here too.
default_path=$(env -u LUA_PATH luajit -e 'io.write(package.path)' 2>&1)
grep -qF "/usr/share/lua/5.1/?.lua" <<<"$default_path" ||
  fail "LuaJIT's default package.path lacks /usr/share/lua/5.1/?.lua: $default_path"
# A segment nobody made: per-process limits, one admission goes through.
loaded=$(env -u RETRYD_LIBRARY -u RETRYD_SOCKET -u RETRYD_SEGMENT LD_LIBRARY_PATH="$root/$libdir" \
  LUA_PATH="$root/$lua_dir/?.lua" luajit -e '
    local retryd = require "retryd"
    local client = assert(retryd.open{ segment = "retryd-check-packages-none" })
    assert(assert(client:dependency("check")):admit()):complete()
    print(package.searchpath("retryd", package.path), retryd.library_path, retryd._VERSION,
          client:is_local() and "local" or "attached")' 2>"$work/lua.err")
want=$(printf '%s\t%s\t%s\t%s' "$root/$lua_dir/retryd.lua" "$soname" "$version" local)
[ "$loaded" = "$want" ] ||
  fail "lua-retryd: did not load $lua_dir/retryd.lua and '$soname' and admit: '$loaded'" \
       "$(cat "$work/lua.err")"

step "the PHP extension: no RPATH, loads in php and calls into libretryd"
ext=$root/$php_extdir/retryd.so
dynamic=$(objdump -p "$ext")
if grep -qE "^ *(RPATH|RUNPATH) " <<<"$dynamic"; then
  fail "php-retryd: retryd.so has an RPATH or RUNPATH:" \
       "$(grep -E "^ *(RPATH|RUNPATH) " <<<"$dynamic")"
fi
grep -qE "^ *NEEDED +$soname\$" <<<"$dynamic" || fail "php-retryd: retryd.so does not need $soname"
grep -qxF "extension=retryd.so" "$root/etc/php/$php_version/mods-available/retryd.ini" ||
  fail "php-retryd: retryd.ini has no line 'extension=retryd.so'"
# -n: no php.ini (nor the host's conf.d); a segment nobody made gives per-process limits, so
# the client is local and one admission goes through.
# shellcheck disable=SC2016  # PHP's variables
got=$(env -u RETRYD_SOCKET -u RETRYD_SEGMENT LD_LIBRARY_PATH="$root/$libdir" \
  php -n -d extension="$ext" -r '
    $c = new Retryd\Client(segment: "retryd-check-packages-none");
    $v = $c->dependency("check")->admit(fn(Retryd\Permit $p) => "admitted");
    echo phpversion("retryd"), " ", Retryd\deadline_header(2.0), " ",
         $c->isLocal() ? "local" : "attached", " ", $v, "\n";' 2>"$work/php.err")
[ "$got" = "$version 2S local admitted" ] ||
  fail "php-retryd: php does not load retryd.so and admit a call: '$got' $(cat "$work/php.err")"

finish
