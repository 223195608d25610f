"""Serve slow HTTP requests until SIGTERM or SIGINT, then stop on a budget and log the report.

    python examples/server_shutdown_cli.py --port 8000 --stop-timeout 10

``GET /slow?seconds=S`` streams S*10 lines, one every 0.1 s; any other path is answered at
once. The exit status is 0 when the stop terminated, 1 when a handler was left running.
Run by tests/test_server_shutdown.py, shown on docs/patterns/server_shutdown.md.
"""

from __future__ import annotations

import argparse
import http.server
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

from patterns.server_shutdown import GracefulServer

logger = logging.getLogger("server_shutdown_cli")


class _SlowHandler(http.server.BaseHTTPRequestHandler):
    """GET /slow?seconds=S streams S*10 lines, one every 0.1 s; any other path is fast."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        """Send the headers and a first line at once, then one line every 0.1 s."""
        path, _, query = self.path.partition("?")
        seconds = float(query.partition("=")[2] or 1) if path == "/slow" else 0.0
        lines = int(seconds * 10)
        self.send_response(200)
        self.send_header("Content-Length", str(lines * 5 + 5))
        self.end_headers()
        self.wfile.write(b"head\n")  # the client knows the request is in flight
        for _ in range(lines):
            time.sleep(0.1)  # the work itself
            self.wfile.write(b"line\n")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        """Each request, through logging."""
        logger.info("%s %s", self.address_string(), format % args)


def main(argv: list[str] | None = None) -> int:
    """Serve slow requests until SIGTERM or SIGINT, stop on the budget, log the report.

    Exit status 0 when the stop terminated, 1 when handlers were left running.
    """
    parser = argparse.ArgumentParser(prog="python examples/server_shutdown_cli.py")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--stop-timeout", type=float, default=10.0)
    parser.add_argument("--grace", type=float, default=0.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    signalled = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: signalled.set())
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), _SlowHandler)
    with GracefulServer(httpd, stop_timeout=args.stop_timeout, grace=args.grace) as server:
        logger.info("serving on %s:%d", *server.address)
        signalled.wait()
        report = server.stop()
    logger.info("report: %s", report)
    if not report.terminated:
        logging.shutdown()
        os._exit(1)  # a handler ignored the close: it must not hold the exit
    return 0


if __name__ == "__main__":
    sys.exit(main())
