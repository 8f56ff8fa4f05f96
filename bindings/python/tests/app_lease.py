"""The /hold endpoint of the WSGI apps the server tests serve (gunicorn_app.py, uwsgi_app.py):
admit on "slow" (a bulkhead of 1) and, with `hold`, write HOLD_DIR/hold-PID and keep the lease
until HOLD_DIR/release exists (300 s at most), so the test can kill the worker holding it."""

import os
import time

import retryd


def hold_lease(client, hold_dir, hold):
    try:
        with client.dependency("slow").admit():
            if hold:
                partial = os.path.join(hold_dir, f".partial-{os.getpid()}")
                with open(partial, "w") as f:
                    f.write(str(os.getpid()))
                # Renamed into place, so the test reads it whole or not at all.
                os.rename(partial, os.path.join(hold_dir, f"hold-{os.getpid()}"))
                end = time.monotonic() + 300
                while not os.path.exists(os.path.join(hold_dir, "release")):
                    if time.monotonic() > end:
                        break
                    time.sleep(0.05)
        return {"outcome": "success"}
    except retryd.Rejected as e:
        return {"outcome": e.reason}
