"""Run the suite on every other CPython with nox, then say which versions ran.

    python scripts/pythons.py run [-- PYTEST_ARGS]   nox sessions for every version but this one
    python scripts/pythons.py summary [--require 3.11,3.12,3.13]

Run it with the main venv's interpreter (``make test`` does): that venv's version has already
run the suite, so ``run`` leaves it out. ``summary`` reads the report ``run`` left and prints
one line, for example::

    python versions: ran 3.11 (.venv), 3.12 (nox), 3.13 (nox); not found: 3.14

and exits 1 when a version named by ``--require`` did not run (``.ci/run`` requires every
supported version, so CI can never silently shrink to fewer).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / ".nox" / "pythons-report.json"
MAIN = f"{sys.version_info.major}.{sys.version_info.minor}"


def _sessions() -> list[tuple[str, str]]:
    """(session name, python version) of every ``tests`` session in the noxfile."""
    listing = subprocess.run(
        [sys.executable, "-m", "nox", "--list", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return [
        (entry["session"], entry["python"])
        for entry in json.loads(listing.stdout)
        if entry["name"] == "tests"
    ]


def run(pytest_args: list[str]) -> int:
    """Run the ``tests`` session of every version except the main venv's; nox's exit status."""
    others = [name for name, python in _sessions() if python != MAIN]
    REPORT.unlink(missing_ok=True)
    command = [
        sys.executable, "-m", "nox",
        "--no-error-on-missing-interpreters",  # summary decides which absences are errors
        "--report", str(REPORT),
        "--sessions", *others,
    ]  # fmt: skip
    if pytest_args:
        command += ["--", *pytest_args]
    return subprocess.run(command, cwd=ROOT, check=False).returncode


def summary(required: list[str]) -> int:
    """Print the one-line verdict; 1 when a required version did not run, else 0."""
    if not REPORT.exists():
        print(f"python versions: no nox report at {REPORT}; run `{Path(__file__).name} run`")
        return 1
    ran = [f"{MAIN} (.venv)"]
    ran_versions = {MAIN}
    missing: list[str] = []
    failed: list[str] = []
    for session in json.loads(REPORT.read_text())["sessions"]:
        version = session["signatures"][0].removeprefix("tests-")
        if session["result"] == "success":
            ran.append(f"{version} (nox)")
            ran_versions.add(version)
        elif session["result"] == "skipped":
            missing.append(version)
        else:
            failed.append(version)
    parts = [f"ran {', '.join(ran)}"]
    if failed:
        parts.append(f"FAILED: {', '.join(failed)}")
    parts.append(f"not found: {', '.join(missing) or 'none'}")
    print(f"python versions: {'; '.join(parts)}")
    absent = [v for v in required if v not in ran_versions and v not in failed]
    if absent:
        print(f"python versions: required but not found: {', '.join(absent)}")
        return 1
    return 1 if failed else 0


def main() -> int:
    """Parse the command line and run ``run`` or ``summary``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("run", help="nox sessions for every version but the main venv's")
    check = commands.add_parser("summary", help="one line: which versions ran, which not")
    check.add_argument(
        "--require",
        default="",
        help="comma- or space-separated versions that must have run, e.g. 3.11,3.12,3.13",
    )
    args, rest = parser.parse_known_args()
    if args.command == "run":
        return run([a for a in rest if a != "--"])
    return summary(args.require.replace(",", " ").split())


if __name__ == "__main__":
    sys.exit(main())
