"""The daemon_threads picture, P15: a daemon thread is abandoned mid-file at interpreter exit.

Run in a child interpreter; the export is the race tests' child, with marks.

Docs: docs/patterns/daemon_threads.md
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from patterns.teaching.lanes import Tracer
from patterns.teaching.scenarios.common import Child, Scenario

_P15_CHILD = """
import queue
from patterns.daemon_threads import run_with_service
from patterns.naive.daemon_threads import naive_run_with_daemon

rows = queue.Queue()
both_written = threading.Event()

def export(stopping):
    out = open({path!r}, "w")
    try:
        out.write("BEGIN\\n")
        mark("opens export.txt, writes BEGIN")
        while not stopping.is_set():
            try:
                row = rows.get(timeout=0.05)  # a bounded wait, so a stop is noticed
            except queue.Empty:
                continue
            out.write(row + "\\n")
            out.flush()
            mark("writes " + row)
            if row == "row 2":
                both_written.set()
    finally:
        out.write("END\\n")
        out.close()
        mark("finally: writes END, closes the file")

def main():
    rows.put("row 1")
    rows.put("row 2")
    both_written.wait(30)
    mark("main returns")

{function}(main, export, name="export"{extra})
"""


def _p15_run(fixed: bool) -> Tracer:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "export.txt")
        code = _P15_CHILD.format(
            function="run_with_service" if fixed else "naive_run_with_daemon",
            path=str(path),
            extra=", stop_timeout=5" if fixed else "",
        )
        child = Child(code)
        try:
            status = child.finish()
        finally:
            child.close()
        last = path.read_text().splitlines()[-1]
    if last != "END":
        child.mark("abandoned at exit: its finally never ran", bad=True, lane="export")
    child.mark(f"child exited {status}; export.txt ends with {last!r}")
    title = "run_with_service" if fixed else "naive_run_with_daemon"
    return child.trace(title, {"MainThread": "child main", "export": "export thread"})


P15 = Scenario.of(
    "P15",
    _p15_run,
    "The daemon thread is abandoned at exit, its finally never runs and the file has "
    "no END; a service stopped in main's finally writes END before the process exits.",
)
