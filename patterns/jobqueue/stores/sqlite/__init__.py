"""The SQLite store, ``store.SQLiteStore``, and its parts.

The schema, transactions, the checkpoint after a crash, and the watcher that wakes a worker
when jobs arrive. ``from patterns.jobqueue import SQLiteStore`` is the usual import.
"""
