# Use it: serve HTTP until Ctrl-C or SIGTERM, stop within 5 s, exit 3 if a handler is stuck.
# prints: serving on port
# Ctrl-C after: serving on port
import http.server
import os
import signal
import threading
import time

from patterns.server_shutdown import GracefulServer


class Slow(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # GET /7 sends its headers, then works for 7 s
        self.send_response(200)
        self.end_headers()
        time.sleep(float(self.path.strip("/") or 0))


stop = threading.Event()
for signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(signum, lambda *_: stop.set())
with GracefulServer(http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow), stop_timeout=5) as s:
    print("serving on port", s.address[1], flush=True)
    stop.wait()  # until the first signal
    report = s.stop()  # within stop_timeout, whatever the handlers do
if not report.terminated:  # a stuck handler's thread is not a daemon: it would hold the exit
    print("exiting with handlers still running:", report.still_running, flush=True)
    os._exit(3)
