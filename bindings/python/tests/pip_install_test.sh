#!/usr/bin/env bash
# pip_install_test.sh SOURCE_DIR LIBRARY: the install bindings/python/README.md gives, offline:
# a virtualenv that sees Debian's setuptools and wheel (python3-venv, python3-setuptools,
# python3-wheel), and `pip install --no-build-isolation` of bindings/python with no package
# index at all. Then, outside the source tree, the installed package must hold the C Permit
# (retryd._speedups, built for the stable ABI: an abi3 wheel) and admit through LIBRARY.
set -euo pipefail
src=$1 library=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# A copy of the package's own files: the build writes build/ and retryd.egg-info where it runs,
# and without client/include beside it the module must build from its own declarations.
mkdir "$tmp/src"
(cd "$src/bindings/python" &&
   cp -r pyproject.toml setup.py README.md "$tmp/src/" &&
   mkdir "$tmp/src/retryd" && cp retryd/*.py retryd/*.c "$tmp/src/retryd/")

/usr/bin/python3 -m venv --system-site-packages "$tmp/venv"
"$tmp/venv/bin/pip" install --quiet --no-build-isolation --no-index "$tmp/src"

tag=$(sed -n 's/^Tag: //p' "$tmp"/venv/lib/python3*/site-packages/retryd-*.dist-info/WHEEL)
case "$tag" in
  cp310-abi3-*) ;;
  *) echo "the wheel is tagged '$tag', not cp310-abi3-*: not built for the stable ABI" >&2; exit 1 ;;
esac

cd "$tmp"
env -u RETRYD_PYTHON_EXTENSION -u RETRYD_PYTHON_PURE -u PYTHONPATH RETRYD_LIBRARY="$library" \
  "$tmp/venv/bin/python" - <<'PY'
import sys

import retryd
from retryd import _client

assert retryd.__file__.startswith(sys.prefix), f"retryd imported from {retryd.__file__}"
assert _client._speedups is not None, "the installed package has no retryd._speedups"
assert _client._speedups.__file__.endswith(".abi3.so"), _client._speedups.__file__
assert retryd.Permit is _client._speedups.Permit
client = retryd.Client(segment="retryd-pip-install-test-absent")
with client.dependency("orders").admit() as permit:
    assert type(permit) is _client._speedups.Permit
client.close()
print(f"installed: {_client._speedups.__file__}")
PY
