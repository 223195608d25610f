"""Put a WSGI route behind a `Bulkhead`: 503 when it is full or stopped, 504 on a timeout.

An example application of ``patterns.bulkhead``, not a pattern module: it imports one.
Wrap a slow route (or a whole app) with ``BulkheadMiddleware(app, Bulkhead(n, q))``, call
``middleware.start()`` before the server takes requests and ``middleware.stop()`` once it
has stopped (or use it as a context manager). Docs: docs/patterns/bulkhead.md
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any, Self

from patterns.bulkhead import (
    Bulkhead,
    BulkheadRejected,
    BulkheadReport,
    BulkheadStopped,
    BulkheadTimeout,
    current_token,
)

__all__ = ["BulkheadMiddleware"]

# WSGI shapes (``wsgiref.types`` has the full ones), for the private helpers; the public
# signatures spell them out.
StartResponse = Callable[..., Callable[[bytes], object]]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


def _check_number(option: str, value: object, *, integer: bool) -> None:
    number = isinstance(value, int) or (not integer and isinstance(value, float))
    if isinstance(value, bool) or not number or not value >= 0:  # type: ignore[operator]
        kind = "an integer of 0 or more" if integer else "a number of seconds, 0 or more"
        raise ValueError(f"{option} must be {kind}, got {value!r}")


def _run_wsgi_app(app: WSGIApp, environ: dict[str, Any]) -> tuple[str, list[Any], list[bytes]]:
    """Run ``app`` to the end of its body; return its status, headers and body chunks.

    The whole response is produced here, so all the work a route does happens on the
    thread that calls this (a bulkhead worker), not later while the server writes it out.
    """
    captured: dict[str, Any] = {}
    body: list[bytes] = []

    def start_response(
        status: str, headers: list[Any], exc_info: Any = None
    ) -> Callable[[bytes], object]:
        # Nothing has been sent yet, so a second call (with exc_info, after an error)
        # simply replaces the first, as PEP 3333 allows before the headers are sent.
        captured.update(status=status, headers=list(headers))
        return body.append  # the legacy write() callable

    result = app(environ, start_response)
    try:
        body.extend(result)
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    if "status" not in captured:
        raise RuntimeError(f"WSGI app {app!r} returned without calling start_response")
    return captured["status"], captured["headers"], body


class BulkheadMiddleware:
    """WSGI middleware that runs ``app`` inside ``bulkhead``: wrap a whole app or one route.

    The app runs on a bulkhead worker, body included (it is collected there, so do not
    wrap a route that streams), while the server's request thread waits up to
    ``timeout`` seconds. Its response is passed on unchanged; an exception it raises is
    re-raised in the request thread, where the server turns it into a 500. When the
    bulkhead is full or stopped the answer is 503 with a ``Retry-After`` header, and when
    the timeout passes it is 504; both have a small JSON body. Inside the app,
    ``environ["bulkhead.token"]`` is the call's `JobToken`.

    Sizing: each waiting request holds a server thread, so keep ``max_concurrent +
    queue_size`` below the server's thread limit, leaving threads for other routes.

    Building the middleware starts nothing. Start the bulkhead before the server takes
    requests, with ``middleware.start()`` (or the bulkhead's own ``start()``), and stop
    it when the server has stopped, with ``middleware.stop()``; as a context manager the
    middleware does both. A request that reaches a bulkhead never started fails with
    `RuntimeError` (a 500: a deployment bug, not a load condition).

    Raises:
        ValueError: ``timeout`` or ``retry_after`` is negative, or not a number.
    """

    def __init__(
        self,
        app: Callable[..., Iterable[bytes]],
        bulkhead: Bulkhead,
        *,
        timeout: float = 30.0,
        retry_after: int = 1,
    ) -> None:
        _check_number("timeout", timeout, integer=False)
        _check_number("retry_after", retry_after, integer=True)
        self.app = app
        self.bulkhead = bulkhead
        self.timeout = float(timeout)
        self.retry_after = retry_after

    def start(self) -> Self:
        """Start the bulkhead (see `Bulkhead.start`) and return the middleware."""
        self.bulkhead.start()
        return self

    def stop(self, timeout: float | None = None) -> BulkheadReport:
        """Stop the bulkhead (see `Bulkhead.stop`); later requests get a 503."""
        return self.bulkhead.stop(timeout)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        """Serve one request through the bulkhead (the WSGI entry point)."""
        try:
            status, headers, body = self.bulkhead.call(
                self._in_worker, environ, timeout=self.timeout
            )
        except BulkheadRejected as exc:
            message = (
                "The bulkhead is stopped."
                if isinstance(exc, BulkheadStopped)
                else "The bulkhead is at capacity. Please try again later."
            )
            extra = [("Retry-After", str(self.retry_after))]
            return self._error(start_response, "503 Service Unavailable", message, extra)
        except BulkheadTimeout:
            message = "The request took too long to process."
            return self._error(start_response, "504 Gateway Timeout", message, [])
        start_response(status, headers)
        return body

    def _in_worker(self, environ: dict[str, Any]) -> tuple[str, list[Any], list[bytes]]:
        environ["bulkhead.token"] = current_token()
        return _run_wsgi_app(self.app, environ)

    def _error(
        self,
        start_response: StartResponse,
        status: str,
        message: str,
        extra: list[tuple[str, str]],
    ) -> list[bytes]:
        payload = {"error": status[4:], "message": message, "bulkhead": self.bulkhead.name}
        body = json.dumps(payload).encode()
        headers = [
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(body))),
            *extra,
        ]
        start_response(status, headers)
        return [body]
