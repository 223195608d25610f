"""The test suite on every supported CPython: one nox session per version, each its own venv.

    nox -s tests-3.13            # one version alone
    nox -s tests                 # every version nox can find (a missing one is skipped)
    make test                    # lint, types, the main venv's suite, then the other versions

Interpreters are found on PATH as ``python3.X``. pyenv's shims answer to that name only when
the version is selected, so the bin directories of pyenv's installs (``pyenv prefix 3.13.0``)
are put on PATH first: the sessions run on the real interpreters, whatever pyenv selects.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import nox

# Oldest first. Versions past the supported ones run when present, so a new CPython shows up
# in `make test` before anyone declares it supported; `.ci/run` requires the supported ones.
SUPPORTED = ("3.11", "3.12", "3.13")
PYTHONS = (*SUPPORTED, "3.14")

nox.options.sessions = ["tests"]
nox.options.reuse_venv = "yes"  # a second run reinstalls the project but keeps the venv
nox.options.error_on_missing_interpreters = False  # `make test` names the missing ones


def _pyenv_bin_dirs() -> list[str]:
    """The bin directories of pyenv's CPython installs of our versions, newest patch first."""
    root = os.environ.get("PYENV_ROOT")
    if not root:
        try:
            root = subprocess.run(
                ["pyenv", "root"], capture_output=True, text=True, check=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return []
    versions = Path(root, "versions")
    found: list[str] = []
    for minor in PYTHONS:
        # "3.13.0", "3.13.1"...; skip "3.13t" (free-threaded) and other flavours by name.
        installs = [
            p
            for p in versions.glob(f"{minor}.*")
            if p.name.removeprefix(f"{minor}.").isdigit()
            and (p / "bin" / f"python{minor}").exists()
        ]
        installs.sort(key=lambda p: int(p.name.rsplit(".", 1)[1]), reverse=True)
        found.extend(str(p / "bin") for p in installs[:1])
    return found


os.environ["PATH"] = os.pathsep.join([*_pyenv_bin_dirs(), os.environ.get("PATH", "")])


@nox.session(python=list(PYTHONS))
def tests(session: nox.Session) -> None:
    """Run pytest with the ``test`` and ``postgres`` extras on one CPython.

    PostgreSQL tests use the cluster named by ``PATTERNS_PG_DSN`` (``make test`` starts one),
    or are skipped when ``PATTERNS_SKIP_POSTGRES=1``; without either they fail, as in the
    main venv.
    """
    session.install("-e", ".[test,postgres]")
    session.run("pytest", "-p", "no:cacheprovider", *session.posargs)
