#!/usr/bin/env python3
"""Warms up every php-fpm child of examples/appserver/run.sh before the run: concurrent
`GET /?warm` through the front until CHILDREN distinct children answered, so that each has
attached to retryd, resolved its dependency and compiled worker.php before the first user
request (the first second is left out of the baseline anyway, but a cold child's first request
is slower than the stall is long).

  warm.py FRONT_SOCKET CHILDREN
"""

import concurrent.futures
import socket
import sys
import time


def warm(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    try:
        s.connect(path)
        s.sendall(b"GET /?warm HTTP/1.0\r\nHost: app\r\n\r\n")
        data = b""
        while chunk := s.recv(4096):
            data += chunk
    finally:
        s.close()
    body = data.split(b"\r\n\r\n", 1)[-1].split()
    return body[1].decode() if len(body) == 2 and body[0] == b"w" else None


def main():
    path, children = sys.argv[1], int(sys.argv[2])
    seen = set()
    deadline = time.monotonic() + 60
    with concurrent.futures.ThreadPoolExecutor(children) as pool:
        while len(seen) < children:
            if time.monotonic() > deadline:
                sys.exit(f"warm.py: {len(seen)} of {children} children answered within 60 s")
            seen.update(p for p in pool.map(lambda _: warm(path), range(children)) if p)
    print(f"warm: {len(seen)} children answered")


if __name__ == "__main__":
    main()
