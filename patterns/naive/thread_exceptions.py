"""Broken on purpose: the naive version of ``patterns.thread_exceptions`` (P8c)."""

from __future__ import annotations

from collections.abc import Callable


def naive_run_main(main: Callable[[], int | None]) -> int:
    """Broken on purpose: a worker thread that failed leaves the exit status at 0."""
    return main() or 0
