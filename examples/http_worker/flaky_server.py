#!/usr/bin/python3
"""A loopback HTTP server that misbehaves on request, to watch retryd_http_worker retry.

    flaky_server.py [PORT]        (default 8080; listens on 127.0.0.1 only)

    /ok                 200
    /busy/N             503 with "Retry-After: 1" for the first N requests, then 200
    /limited/N          429 with "Retry-After: 2" for the first N requests, then 200
    /down               500, always
    /missing            404
    /slow/MS            200 after MS milliseconds (to meet the worker's timeout)
"""

import http.server
import sys
import threading
import time

_counts = {}
_lock = threading.Lock()


class Handler(http.server.BaseHTTPRequestHandler):
    def _reply(self, status, headers=(), body=b"ok\n"):
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _count(self):
        with _lock:
            _counts[self.path] = _counts.get(self.path, 0) + 1
            return _counts[self.path]

    def do_GET(self):
        parts = self.path.strip("/").split("/")
        n = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        if parts[0] == "ok":
            self._reply(200)
        elif parts[0] == "busy":
            self._reply(503, [("Retry-After", "1")]) if self._count() <= n else self._reply(200)
        elif parts[0] == "limited":
            self._reply(429, [("Retry-After", "2")]) if self._count() <= n else self._reply(200)
        elif parts[0] == "down":
            self._reply(500)
        elif parts[0] == "slow":
            time.sleep(n / 1000)
            self._reply(200)
        else:
            self._reply(404, body=b"not found\n")

    do_POST = do_GET

    def log_message(self, fmt, *args):
        sys.stderr.write("server: " + fmt % args + "\n")


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8080
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print(f"listening on 127.0.0.1:{port}", flush=True)
    server.serve_forever()
