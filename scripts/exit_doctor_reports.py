"""Run each hazard of examples/exit_doctor/ under the exit doctor; keep the reports for the page.

    python scripts/exit_doctor_reports.py           rewrite docs/patterns/exit_doctor_reports/
    python scripts/exit_doctor_reports.py --check   exit 1 when a kept report differs from a run

Each hazard runs as ``python -m patterns.exit_doctor --after 1 --kill examples/exit_doctor/X.py``
from the repository's root, with this interpreter (the page says which version). Two things
are rewritten so the text does not depend on the machine: the standard library's directory
becomes ``<stdlib>/`` and process ids become ``<pid>``. Everything else is the run's stderr.
``tests/test_exit_doctor.py`` runs the check on the version the reports were taken with.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HAZARDS = ROOT / "examples" / "exit_doctor"
REPORTS = ROOT / "docs" / "patterns" / "exit_doctor_reports"
VERSION = (3, 11)  # the version the kept reports come from (the main venv's)


def report(name: str) -> str:
    """What the doctor writes to stderr for ``examples/exit_doctor/<name>.py``, made portable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    command = f"-m patterns.exit_doctor --after 1 --kill examples/exit_doctor/{name}.py"
    run = subprocess.run(
        [sys.executable, *command.split()],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    text = run.stderr.replace(sysconfig.get_paths()["stdlib"] + os.sep, "<stdlib>/")
    text = re.sub(r"\bpid \d+", "pid <pid>", text)
    return f"$ python {command}\n{run.stdout}{text}(exit status {run.returncode})\n"


def names() -> list[str]:
    """The hazards, by file name."""
    return sorted(p.stem for p in HAZARDS.glob("*.py"))


def main() -> int:
    """Rewrite the reports, or with ``--check`` compare them with a fresh run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    check = parser.parse_args().check
    if sys.version_info[:2] != VERSION:
        print(f"the kept reports come from Python {VERSION[0]}.{VERSION[1]}; run it with that")
        return 2
    stale = []
    REPORTS.mkdir(exist_ok=True)
    for name in names():
        path = REPORTS / f"{name}.txt"
        text = report(name)
        if check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        print(f"reports differ from a run: {stale}; run python scripts/exit_doctor_reports.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
