"""The worker and its parts, each in its own module here.

One `~.Worker` (``worker.py``) composes a claimer, handler threads, a settler, a heartbeat
and a report (docs/jobqueue/composition.md). ``from patterns.jobqueue import Worker`` is the
usual import; the parts are the worker's own.
"""
