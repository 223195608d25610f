"""Fixtures for the job queue's PostgreSQL tests: the server, fresh schemas, fresh databases.

The tests run against a real server named by ``PATTERNS_PG_DSN``. ``make test`` starts a
throwaway one with ``scripts/pg-test-cluster.sh run -- ...``, which sets the variable.
Without it, every PostgreSQL test fails and says how to start one; they are skipped only
when ``PATTERNS_SKIP_POSTGRES=1`` asks for it, never silently.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

DSN_VARIABLE = "PATTERNS_PG_DSN"
SKIP_VARIABLE = "PATTERNS_SKIP_POSTGRES"
HOW_TO_START = (
    "run the tests against a throwaway server: "
    "scripts/pg-test-cluster.sh run -- .venv/bin/pytest ... "
    f"(it sets {DSN_VARIABLE}), or set {SKIP_VARIABLE}=1 to skip the PostgreSQL tests"
)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A path for a SQLite job store file that does not exist yet."""
    return tmp_path / "jobs.db"


@pytest.fixture(scope="session")
def pg_dsn() -> str:
    """The test server's DSN; a failure saying how to start one, or a skip if asked for."""
    if os.environ.get(SKIP_VARIABLE) == "1":
        pytest.skip(f"PostgreSQL tests skipped on request ({SKIP_VARIABLE}=1)")
    try:
        import psycopg  # noqa: PLC0415 - optional: only these tests need it
    except ImportError:
        pytest.fail(
            "psycopg is not installed: pip install -e '.[dev]' (it includes the postgres "
            f"extra), or set {SKIP_VARIABLE}=1 to skip the PostgreSQL tests"
        )
    dsn = os.environ.get(DSN_VARIABLE)
    if not dsn:
        pytest.fail(f"{DSN_VARIABLE} is not set; {HOW_TO_START}")
    try:
        psycopg.connect(dsn, connect_timeout=5).close()
    except psycopg.Error as exc:
        pytest.fail(f"cannot connect to {DSN_VARIABLE}: {exc}; {HOW_TO_START}")
    return dsn


def admin_execute(dsn: str, statement: str, params: tuple[object, ...] = ()) -> list[tuple]:
    """Run one statement outside any store, in autocommit mode, and return its rows."""
    import psycopg  # noqa: PLC0415 - optional: only these tests need it

    with psycopg.connect(dsn, autocommit=True) as conn:
        cursor = conn.execute(statement, params)  # type: ignore[arg-type]
        return cursor.fetchall() if cursor.description else []


@pytest.fixture
def pg_schema(pg_dsn: str) -> Iterator[str]:
    """A schema name nobody has used; the schema (if a store created it) is dropped after."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    yield name
    admin_execute(pg_dsn, f'DROP SCHEMA IF EXISTS "{name}" CASCADE')  # a generated name


def url_with_database(dsn: str, database: str) -> str:
    """A ``postgresql://`` URL for the server of ``dsn``, naming ``database``."""
    from psycopg.conninfo import conninfo_to_dict  # noqa: PLC0415 - optional dependency

    params = conninfo_to_dict(dsn)
    user = quote(str(params.get("user") or ""), safe="")
    password = params.get("password")
    auth = f"{user}:{quote(str(password), safe='')}@" if password else f"{user}@" if user else ""
    host = params.get("host") or "localhost"
    port = params.get("port") or 5432
    return f"postgresql://{auth}{host}:{port}/{database}"


@pytest.fixture
def pg_database(pg_dsn: str) -> Iterator[str]:
    """A ``postgresql://`` URL of a new, empty database, dropped (connections and all) after."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    admin_execute(pg_dsn, f'CREATE DATABASE "{name}"')  # a generated name
    try:
        yield url_with_database(pg_dsn, name)
    finally:
        admin_execute(pg_dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
