"""The PostgreSQL comparison benchmark runs end to end (``benchmarks/postgres_compare.py``).

A smoke test of the harness, not of anyone's speed: ``--quick`` against the test server,
and nothing asserted on a time. It needs the peers of the ``bench`` extra (pgqueuer,
procrastinate), which ``make bench`` installs; without them it is skipped, saying so.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PEERS = ("pgqueuer", "asyncpg", "procrastinate", "psycopg_pool")


# A dozen fresh interpreters, each importing a peer's stack and making a database: about
# 20 s on a quiet 2-core machine, and past the suite's 60 s default when it is shared.
@pytest.mark.timeout(150)
def test_the_comparison_prints_a_row_for_every_system_in_a_quick_run(pg_dsn: str) -> None:
    """A quick run exits 0 and prints every system's row with a drain rate and a wake-up."""
    missing = [name for name in PEERS if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(
            f"the bench extra is not installed (missing {', '.join(missing)}): "
            "pip install -e '.[bench]' to run the comparison's smoke test"
        )
    env = dict(os.environ, PATTERNS_PG_DSN=pg_dsn, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.postgres_compare",
            "--quick",
            "--no-statements",
            "--ours",
            "threads=2, poll_interval=0.5",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=140,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {line.split("  ")[0]: line for line in done.stdout.splitlines()}
    for label in (
        "this project (threads=2, poll_interval=0.5)",
        "procrastinate (concurrency 4)",
        "pgqueuer (asyncpg, at most 4 in flight)",
        "pgqueuer at its defaults (batch 10)",
    ):
        assert label in rows, done.stdout
        cells = rows[label][len(label) :].split()
        assert cells[0] != "-", rows[label]  # a drain rate
        assert "ms" in cells, rows[label]  # a wake-up latency
