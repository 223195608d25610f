"""Benchmarks: measurements to read, never tests; each module runs with ``python -m``."""
