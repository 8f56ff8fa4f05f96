"""Every constant the Python package copies from the C headers has the headers' value.

The package declares the C ABI by hand (ctypes has no header parser), so a value changed in
retryd.h, retryd_policy.h or retryd_call.h and not here would silently mean something else.
"""
import pathlib
import re

from retryd import _native

HEADERS = pathlib.Path(__file__).resolve().parents[3] / "client" / "include" / "retryd"
DEFINE = re.compile(r"^#define RETRYD_([A-Z0-9_]+)\s+\(?(-?\d+)\)?", re.M)


def header_values():
    values = {}
    for name in ("retryd.h", "retryd_policy.h", "retryd_call.h"):
        for key, value in DEFINE.findall((HEADERS / name).read_text()):
            values[key] = int(value)
    return values


def test_every_integer_constant_matches_its_header():
    values = header_values()
    copied = {k: v for k, v in vars(_native).items()
              if k.isupper() and isinstance(v, int) and k != "NO_TIMEOUT"}
    assert copied, "no constants found in retryd._native"
    for key, value in copied.items():
        assert key in values, f"_native.{key} has no RETRYD_{key} in the headers"
        assert values[key] == value, f"_native.{key} = {value}, but RETRYD_{key} = {values[key]}"


def test_jitter_names_match_their_header():
    values = header_values()
    for name, value in _native.JITTER.items():
        assert values[f"JITTER_{name.upper()}"] == value


def test_no_timeout_is_int64_max():
    text = (HEADERS / "retryd_call.h").read_text()
    assert re.search(r"#define RETRYD_NO_TIMEOUT INT64_MAX", text)
    assert _native.NO_TIMEOUT == 2**63 - 1
