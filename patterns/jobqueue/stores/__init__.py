"""Where jobs are kept: the protocol a store implements (`protocol`), and three stores.

`memory` (for tests and the lesson), `sqlite` (the default: one file, many processes on one
machine) and `postgres` (many machines). ``from patterns.jobqueue import SQLiteStore`` is the
usual import.
"""
