"""The compiled part of the package: retryd._speedups, the Permit in C (retryd/_speedups.c).

The metadata is in pyproject.toml; setuptools takes the extension from here. It is optional:
without a C compiler or Python's headers (Debian: python3-dev) the build goes on without it,
and the package runs its ctypes Permit instead. It is built against Python's stable ABI of
3.10 (one `_speedups.abi3.so` for every later CPython), and needs no libretryd to build: the
package hands it the library it loads at run time. In the source tree it also checks its
declarations against client/include/retryd/retryd.h.

Offline, in a virtualenv that sees Debian's setuptools and wheel:

    python3 -m venv --system-site-packages venv
    venv/bin/pip install --no-build-isolation bindings/python
"""

import os
import platform
import sys

from setuptools import Extension, setup

HERE = os.path.dirname(os.path.abspath(__file__))
HEADERS = os.path.join(HERE, "..", "..", "client", "include")

speedups = Extension(
    "retryd._speedups",
    sources=["retryd/_speedups.c"],
    include_dirs=[HEADERS] if os.path.isfile(os.path.join(HEADERS, "retryd", "retryd.h")) else [],
    py_limited_api=True,
    optional=True,
)

compiled = platform.python_implementation() == "CPython" and sys.version_info >= (3, 10)
setup(
    ext_modules=[speedups] if compiled else [],
    options={"bdist_wheel": {"py_limited_api": "cp310"}} if compiled else {},
)
