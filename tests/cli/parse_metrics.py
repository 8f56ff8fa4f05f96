#!/usr/bin/python3
"""Parses Prometheus text exposition with the reference parser and prints the samples as JSON.

Usage: parse_metrics.py < metrics.txt
Prints {"families": {NAME: TYPE}, "samples": [[SAMPLE_NAME, {LABELS}, VALUE], ...]} and exits
0, or prints the parser's error and exits 1. Needs Debian's python3-prometheus-client.
"""
import json
import sys

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    print("python3-prometheus-client is not installed (apt-get install python3-prometheus-client)")
    sys.exit(2)


def main():
    text = sys.stdin.read()
    families = {}
    samples = []
    try:
        for family in text_string_to_metric_families(text):
            families[family.name] = family.type
            for s in family.samples:
                samples.append([s.name, dict(s.labels), s.value])
    except Exception as e:  # the parser raises ValueError and friends on bad input
        print(f"prometheus parser rejected the text: {e!r}")
        return 1
    print(json.dumps({"families": families, "samples": samples}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
