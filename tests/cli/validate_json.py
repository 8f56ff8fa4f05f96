#!/usr/bin/python3
"""Validates retryctl --json output against docs/retryctl-json-schema.json.

Usage: validate_json.py SCHEMA < output
Every non-empty line of stdin is one JSON document (retryctl prints one per refresh with
--watch). Checks the schema itself (JSON Schema draft 2020-12), then every document. Prints
"ok N" and exits 0, or prints each problem with its JSON path and exits 1.
Needs Debian's python3-jsonschema.
"""
import json
import sys

try:
    import jsonschema
except ImportError:
    print("python3-jsonschema is not installed (apt-get install python3-jsonschema)")
    sys.exit(2)


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        schema = json.load(f)
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    validator = validator_class(schema)
    problems = 0
    documents = 0
    for number, line in enumerate(sys.stdin, 1):
        if not line.strip():
            continue
        documents += 1
        doc = json.loads(line)
        for error in validator.iter_errors(doc):
            problems += 1
            path = "/".join(str(p) for p in error.absolute_path)
            print(f"line {number}: /{path}: {error.message}")
    if documents == 0:
        print("no JSON document on stdin")
        return 1
    if problems:
        return 1
    print(f"ok {documents}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
