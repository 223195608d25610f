"""The server_shutdown picture, W2: SIGTERM to an HTTP server process with two requests in flight.

The server runs in a child interpreter (its marks come back through its stdout); the
parent is the platform and the clients: it probes /ready, sends the requests over real
HTTP, and sends SIGTERM. Request A's work ends once the drain has begun; request B waits
for a body that never comes, so only a forced close ends it.

Docs: docs/patterns/server_shutdown.md
"""

from __future__ import annotations

import http.client
import os
import signal

from patterns.teaching.lanes import Tracer
from patterns.teaching.scenarios.common import Child, Scenario

_W2_CHILD = """
import http.server, logging, signal, threading
FIXED = {fixed}
release_a = threading.Event()  # request A's work ends once the drain has begun

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        if self.path == "/ready":  # the naive server has no readiness of its own
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        which = "A" if self.path == "/a" else "B"
        threading.current_thread().name = "handler " + which
        if which == "A":
            mark("GET /a: works until the drain")
            release_a.wait(30)
            self.send_response(200)
            self.send_header("Content-Length", "3")
            self.end_headers()
            self.wfile.write(b"ok\\n")
            mark("answers 200")
        else:
            mark("GET /b: reads a body that never comes")
            got = self.rfile.read(10)
            mark(f"read returns {{got!r}}: closed by force")

    def log_message(self, *args):
        pass

class Marks(logging.Handler):
    def emit(self, record):
        text = record.getMessage().split(": ", 1)[1]
        if text.startswith("stopped"):
            return
        mark(text.split(" 127.0.0.1")[0] + (" B" if "by force" in text else ""))
        if text == "listener closed":
            release_a.set()

httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
signalled = threading.Event()
server = None

def on_sigterm(signum, frame):
    if signalled.is_set() and server is not None:
        mark("SIGTERM again: its stop() returns at once, the grace ends")
        server.stop(0)  # inside the running stop(): returns at once
    signalled.set()

signal.signal(signal.SIGTERM, on_sigterm)
mark(f"listening on {{httpd.server_address[1]}}")
if FIXED:
    from patterns.server_shutdown import GracefulServer
    log = logging.getLogger("patterns.server_shutdown")
    log.addHandler(Marks())
    log.setLevel(logging.INFO)
    server = GracefulServer(httpd, stop_timeout=1.0, grace=30).start()
    signalled.wait(30)
    report = server.stop()
    mark(f"report: completed {{len(report.completed)}}, interrupted {{len(report.interrupted)}}")
else:
    from patterns.naive.server_shutdown import naive_serve, naive_stop
    naive_serve(httpd)
    signalled.wait(30)
    naive_stop(httpd)
    mark("naive_stop() returned: main ends, the interpreter exits")
"""


def _w2_run(fixed: bool) -> Tracer:
    child = Child(_W2_CHILD.format(fixed=fixed), parent_lane="platform")
    try:
        child.expect("listening on ")
        port = int(next(m[2] for m in child.marks if m[2].startswith("listening on")).split()[-1])
        probe = _get(port, "/ready")
        child.mark(f"GET /ready: {probe}")
        a = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        a.request("GET", "/a")
        child.expect("GET /a")
        b = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        b.putrequest("GET", "/b")
        b.putheader("Content-Length", "10")
        b.endheaders()  # and no body
        child.expect("GET /b")
        child.mark("SIGTERM")
        os.kill(child.proc.pid, signal.SIGTERM)
        if fixed:
            child.expect("stopping")
            child.mark(f"GET /ready: {_get(port, '/ready')}")
            os.kill(child.proc.pid, signal.SIGTERM)
        child.mark(f"A gets {_answer(a)}", lane="clients")
        child.mark(f"B gets {_answer(b)}", lane="clients")
        status = child.finish()
    finally:
        child.close()
    texts = [m[2] for m in child.marks]
    for which, answered in (("A", "answers 200"), ("B", "closed by force")):
        if not any(text.startswith(answered) or answered in text for text in texts):
            child.mark(
                "cut off at exit: a daemon, never answered", bad=True, lane=f"handler {which}"
            )
    child.mark(f"the server exited {status}")
    title = (
        "GracefulServer(grace=30, stop_timeout=1)"
        if fixed
        else "naive_stop: shutdown(), server_close()"
    )
    return child.trace(
        title,
        {
            "platform": "platform",
            "clients": "clients",
            "MainThread": "server main",
            "server-serve": "serve loop",
            "handler A": "handler A",
            "handler B": "handler B",
        },
    )


def _get(port: int, path: str) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        return str(response.status)
    except ConnectionRefusedError:
        return "connection refused"
    finally:
        conn.close()


def _answer(conn: http.client.HTTPConnection) -> str:
    try:
        response = conn.getresponse()
        body = response.read()
        return f"{response.status} {body!r}, Connection: {response.getheader('Connection')}"
    except (http.client.HTTPException, OSError) as exc:
        return f"no answer ({type(exc).__name__})"
    finally:
        conn.close()


W2 = Scenario.of(
    "W2",
    _w2_run,
    "Naive: after SIGTERM, shutdown() and server_close() return at once and the process "
    "exits under both requests, whose daemon handlers never answer. GracefulServer: "
    "/ready fails first, the listener closes after the grace, A finishes and is answered "
    "with Connection: close, B is closed by force at the drain deadline, and the report "
    "says so before the exit.",
    lanes="a thread of the server process, or the platform and the clients outside it",
)
