"""The command line: ``python -m patterns.jobqueue`` (``main.py``, its parts), demo, signals.

This package's own import is light: `signal_guard` must be in place before the worker's
modules are imported (see ``__main__``).
"""
