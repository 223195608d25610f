"""Which queue a command works on, and how a one-shot command opens it within ``--wait``.

`queue_name` reads ``--db`` (or ``$JOBQUEUE_DB``) and refuses a queue that would vanish
with the process; `open_store` opens an SQLite file or a PostgreSQL database, refusing
one that does not exist unless asked to create it; `with_store` runs one command's store
calls, the opening included, under the ``--wait`` deadline
(`patterns.jobqueue.stores.deadline`) and turns any store error into one line, exit 2;
`without_retry_warnings` keeps the stores' retry warnings out of a one-shot command's
stderr. The worker opens its store with `open_store` too, under its own start-up budget.

Docs: docs/jobqueue/operations.md
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from patterns.jobqueue.cli.output import UsageError
from patterns.jobqueue.stores.deadline import Deadline, StoreTimeout, bounded_by
from patterns.jobqueue.stores.postgres.store import (
    PostgresStore,
    StoreSchemaError,
    StoreUnavailable,
    is_postgres_url,
)
from patterns.jobqueue.stores.protocol import Store
from patterns.jobqueue.stores.sqlite.schema import is_busy
from patterns.jobqueue.stores.sqlite.store import WATCH_INTERVAL, SQLiteStore, StoreFileError

__all__ = [
    "DB_VARIABLE",
    "DEFAULT_WAIT",
    "open_store",
    "queue_name",
    "with_store",
    "without_retry_warnings",
]

DB_VARIABLE = "JOBQUEUE_DB"
"""The environment variable naming the queue when ``--db`` is not given."""

# A one-shot command's default --wait: as long as an SQLite file's busy retries last (five
# attempts of its 5 s busy wait, and the backoff between them: 26.5 s measured).
DEFAULT_WAIT = 26.0
"""A one-shot command's ``--wait`` when it is not given, in seconds."""

T = TypeVar("T")

# The loggers of the stores' retries; both mark those records with a ``retry`` attribute
# (a logger's filter sees only its own records, not its children's).
_STORE_LOGGERS = (
    "patterns.jobqueue.stores.postgres.connection",
    "patterns.jobqueue.stores.sqlite.transactions",
)


class _NoRetries(logging.Filter):
    """Drops the records of a store call's retries."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not hasattr(record, "retry")


@contextlib.contextmanager
def without_retry_warnings() -> Iterator[None]:
    """A one-shot command's failure is its one error line, which names the retries' last error.

    The worker, a long-running process, logs each retry: an operator watches its log.
    """
    quiet = _NoRetries()
    loggers = [logging.getLogger(name) for name in _STORE_LOGGERS]
    for store_logger in loggers:
        store_logger.addFilter(quiet)
    try:
        yield
    finally:
        for store_logger in loggers:
            store_logger.removeFilter(quiet)


# --- the queue: which one, opened how --------------------------------------------------------


def queue_name(args: argparse.Namespace) -> str:
    """The queue ``args`` name: ``--db``, else ``$JOBQUEUE_DB``.

    Raises `~patterns.jobqueue.cli.output.UsageError` if there is none, or if it names a
    queue that would vanish with the process (``:memory:``) or an SQLite URI.
    """
    name: str | None = args.db or os.environ.get(DB_VARIABLE) or None
    if name is None:
        raise UsageError(
            f"the following arguments are required: --db (for {args.command}), or set {DB_VARIABLE}"
        )
    if is_postgres_url(name):
        return name
    if name.strip() == ":memory:" or "mode=memory" in name or name.startswith("file::memory:"):
        raise UsageError(
            f"--db {name}: an in-memory database vanishes when this command exits, and "
            "every job with it; give a file path"
        )
    if name.startswith("file:"):
        raise UsageError(f"--db {name}: SQLite URIs are not accepted; give a file path")
    return name


def _store_errors() -> tuple[type[Exception], ...]:
    """What a store raises when it cannot do what it was asked (never a bad argument).

    psycopg's errors count once psycopg is loaded, which a PostgreSQL store does as it
    connects: importing it up front would cost a SQLite worker about 30 ms at every exit.
    """
    errors: list[type[Exception]] = [
        StoreFileError,
        StoreSchemaError,
        StoreUnavailable,
        sqlite3.Error,
        OSError,
    ]
    psycopg = sys.modules.get("psycopg")
    if psycopg is not None:
        errors.append(psycopg.Error)
    return tuple(errors)


def _open_errors() -> tuple[type[Exception], ...]:
    """What opening a store raises for a queue that cannot be used (exit 2)."""
    return (ImportError, ValueError, *_store_errors())


def _shown(db: str) -> str:
    """``db`` fit for a message: a URL's password replaced by ``***``."""
    return re.sub(r"(://[^/@]*?:)[^/@]*@", r"\1***@", db)


def open_store(
    path: str, *, create: bool = False, watch_interval: float = WATCH_INTERVAL
) -> SQLiteStore | PostgresStore:
    """Open the queue; without ``create``, a queue that does not exist is refused, not made."""
    if not create and not is_postgres_url(path) and not os.path.exists(path):
        raise UsageError(f"no such queue: {path}")
    try:
        if is_postgres_url(path):
            return PostgresStore(path, create=create)
        return SQLiteStore(path, create=create, watch_interval=watch_interval)
    except StoreTimeout:
        raise  # the caller's deadline passed: the caller says what that means
    except _open_errors() as exc:
        raise UsageError(str(exc)) from exc


def with_store(args: argparse.Namespace, action: Callable[[Store], T], *, what: str) -> T:
    """Open the queue, run ``action`` on it, close it; a store error is one line, exit 2.

    Every store call, the opening included, keeps to ``--wait``
    (`patterns.jobqueue.stores.deadline`): a lock another connection holds is waited for
    that long at most, on either store. Without ``--wait`` the bound is `DEFAULT_WAIT` and
    an SQLite file's own busy retries may end sooner; with it, they go on until it passes
    (a patient deadline).
    """
    wait = DEFAULT_WAIT if args.wait is None else args.wait
    deadline = Deadline(patient=args.wait is not None)
    began = time.monotonic()
    deadline.set(began + wait)
    try:
        with bounded_by(deadline):
            store = open_store(args.db, create=args.command == "enqueue")
            try:
                return action(store)
            finally:
                store.close()
    except (TypeError, ValueError, StoreFileError) as exc:  # a refused argument, a bad file
        raise UsageError(str(exc)) from exc  # (a StoreFileError names the file itself)
    except StoreTimeout as exc:
        waited = time.monotonic() - began
        raise UsageError(
            f"{_shown(args.db)}: cannot {what}: {exc} (still waiting after {waited:.1f} s, "
            f"the --wait limit ({wait:g} s): another connection holds a lock on the queue, "
            "or the server does not answer); nothing was changed"
        ) from exc
    except _store_errors() as exc:
        detail = str(exc)
        if isinstance(exc, sqlite3.OperationalError) and is_busy(exc):
            # The store's retries waited for another connection's write lock: say how long.
            waited = time.monotonic() - began
            detail += f" (another connection still held the write lock after {waited:.1f} s)"
        raise UsageError(f"{_shown(args.db)}: cannot {what}: {detail}") from exc
    finally:
        deadline.finish()  # ends its timer, if a statement was to be cancelled at it
