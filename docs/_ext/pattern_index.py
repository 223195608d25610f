"""The pattern table, one list for two readers: the README's table and the docs home page's.

The README shows repository paths (a reader on GitHub or in a checkout opens files); the home
page starts from what the reader sees go wrong and links the pattern page, the notebook and
the module. Both come from `PATTERNS`, in the docs' reading order. After editing the list,
rewrite the README's table with ``python docs/_ext/pattern_index.py``;
``tests/test_pattern_index.py`` fails while the README and the list disagree.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
START = "<!-- start-pattern-table: generated from docs/_ext/pattern_index.py -->"
END = "<!-- end-pattern-table -->"


@dataclass(frozen=True)
class Pattern:
    """One pattern: its files share ``stem``; the notebook is numbered."""

    name: str
    stem: str  # patterns/<stem>.py, tests/test_<stem>.py, docs/patterns/<stem>.md
    notebook: str  # notebooks/<notebook>.ipynb
    symptom: str  # what the reader sees go wrong, for the home page
    pitfalls: str  # every pitfall the module prevents, for the README
    extra_module: str = ""  # said after the module's path in the README
    extra_tests: tuple[str, ...] = ()

    @property
    def module(self) -> str:
        """The module's path in the repository."""
        return f"patterns/{self.stem}.py"

    @property
    def tests(self) -> tuple[str, ...]:
        """The test files' paths in the repository."""
        return (f"tests/test_{self.stem}.py", *self.extra_tests)

    @property
    def page(self) -> str:
        """The docs page's path in the repository."""
        return f"docs/patterns/{self.stem}.md"

    @property
    def notebook_path(self) -> str:
        """The notebook's path in the repository."""
        return f"notebooks/{self.notebook}.ipynb"


# In the order of the docs' sidebar (the "Patterns" toctree of docs/index.md).
PATTERNS = [
    Pattern(
        "Executor shutdown",
        "executor_shutdown",
        "01-executor-shutdown",
        "the program hangs in `shutdown()` or at the end of a `with` pool; "
        "a task's exception is never seen; a task waits for its own pool",
        "`shutdown(wait=False)` racing a `close()`; `cancel_futures=True` mistaken for "
        "`shutdownNow()`; `shutdown()` with no timeout; unread task exceptions; work lost on "
        "submit-after-shutdown; a task that waits for its own pool (P6)",
    ),
    Pattern(
        "Cooperative cancellation",
        "cancellation",
        "02-cancellation",
        "a loop or a blocking call, `queue.get()` too, that nothing can stop",
        "a CPU loop or a blocking call (`queue.get()` included: `take(q, token)`) that nothing "
        "can stop; forced async exceptions that cut `finally` short",
    ),
    Pattern(
        "Poison pills",
        "poison_pill",
        "03-poison-pill",
        "consumers still blocked after the producers finished; `Queue.join()` never returns",
        "one pill for N consumers leaves N-1 blocked; each producer's own pill strands "
        "another's items; a pill that cannot be put on a full queue; `Queue.join()` hanging "
        "on a missed `task_done()`",
    ),
    Pattern(
        "Closable queue",
        "closable_queue",
        "04-closable-queue",
        "threads blocked in `get()` or `put()` that nothing can wake",
        "consumers blocked in `get()` and producers blocked in `put()` that nothing can wake; "
        "Python 3.13's `Queue.shutdown()` on 3.11+",
    ),
    Pattern(
        "Thread exceptions",
        "thread_exceptions",
        "05-thread-exceptions",
        "a worker thread died and nobody noticed; exit status 0 after a failure",
        "a worker that dies silently; a future's exception nobody reads; `sys.exit()` in a "
        "thread ignored; exit status 0 after a worker failed",
    ),
    Pattern(
        "Supervisor",
        "supervisor",
        "10-supervisor",
        "a consumer died, and its producer blocks on the full queue forever",
        "a consumer thread that dies while its producer blocks on the full queue forever; "
        "restarting a dead worker within a budget",
    ),
    Pattern(
        "Daemon threads",
        "daemon_threads",
        "06-daemon-threads",
        "a background thread cut off mid-write at exit, or one the exit waits for",
        "a daemon thread abandoned mid-write at exit (its `finally` never runs); an `atexit` "
        "handler meant to stop a non-daemon thread that never runs, because exit waits for "
        "the thread first",
    ),
    Pattern(
        "Exit hooks",
        "exit_hooks",
        "07-exit-hooks",
        "an exit hook's log line is lost, or its failure only reaches stderr; "
        "`os._exit` loses the last output",
        "an `atexit` handler that logs after `logging.shutdown`; a failing `atexit` handler "
        "seen only on stderr, with status 0; `os._exit` losing buffered output, `finally` and "
        "`atexit`",
    ),
    Pattern(
        "Signal handlers",
        "signal_handlers",
        "20-signal-handlers",
        "SIGTERM skips `finally` and `atexit`; a second Ctrl-C cannot force the exit",
        "default SIGTERM skipping `finally` and `atexit`; a signal handler that deadlocks or "
        "never runs; a second Ctrl-C that cannot force the exit",
    ),
    Pattern(
        "Bulkhead",
        "bulkhead",
        "08-bulkhead",
        "a burst of slow requests takes every thread and the fast routes stall",
        "an unbounded pool in a server: a burst of slow requests takes every thread and the "
        "fast routes stall; a timeout that frees nothing; a close that strands queued callers",
        extra_module="(the WSGI example: `examples/bulkhead_wsgi.py`)",
        extra_tests=("tests/test_bulkhead_http.py",),
    ),
    Pattern(
        "Async queue",
        "async_queue",
        "11-async-queue",
        "consumer tasks still waiting in `get()` after the one sentinel was taken",
        "one sentinel for N consumer tasks leaves N-1 waiting in `get()` forever; Python "
        "3.13's `asyncio.Queue.shutdown()` on 3.11+; a consumer-task pool with a deadline and "
        "a report",
    ),
    Pattern(
        "asyncio shutdown",
        "asyncio_shutdown",
        "12-asyncio-shutdown",
        "`asyncio.run` never returns; a task vanishes or fails unheard",
        "a cancellation swallowed by `except BaseException`; cancel-then-gather with no "
        "deadline; a fire-and-forget task collected mid-flight; a background failure nobody "
        "hears of; `to_thread` work no cancel can reach, and `asyncio.run` waiting for it at "
        "exit; a shielded cleanup nobody waits for or hears fail; a `TaskGroup` that no "
        "deadline can end; a stop a `TaskGroup` drops, or a cancel it leaves counted, on "
        "3.11 and 3.12",
    ),
    Pattern(
        "asyncio signals",
        "asyncio_signals",
        "19-asyncio-signals",
        "SIGTERM kills an asyncio program with no cleanup; a second signal cannot end a stuck "
        "drain",
        "SIGTERM killing `asyncio.run` with no cleanup; a second signal that cannot force the "
        "exit; a nested handler that leaves SIGTERM doing nothing once it is removed",
    ),
    Pattern(
        "Process shutdown",
        "process_shutdown",
        "13-process-shutdown",
        "a stuck pool worker holds the exit; a dead one breaks the pool or loses a result",
        "a stuck worker keeping `with ProcessPoolExecutor()` and the exit waiting; a dead "
        "worker breaking the pool; `with Pool()` killing running tasks; `Pool.join()` with "
        "no timeout; a killed `Pool` worker's result never arriving; `Pool.terminate()` "
        "waiting for a worker deaf to SIGTERM; a killed idle `Pool` worker's lock hanging "
        "`join()` and `terminate()`",
    ),
    Pattern(
        "Stoppable process",
        "stoppable_process",
        "18-stoppable-process",
        "`terminate()` skips a child's cleanup; Ctrl-C reaches every child",
        "`terminate()` skipping a child's `finally` and `atexit`; a `multiprocessing.Queue` "
        "holding the exit; Ctrl-C reaching every child; `fork()` copying a held lock; "
        "`Event.set()` waiting for a killed child",
    ),
    Pattern(
        "Server shutdown",
        "server_shutdown",
        "14-server-shutdown",
        "requests dropped on deploy; a threaded server that won't stop, or waits for a "
        "kept-alive client",
        "`shutdown()` deadlocking on the serving thread; `ThreadingHTTPServer`'s daemon "
        "handlers cut off at exit; `server_close()` joining handlers with no timeout; a "
        "kept-alive connection served after the stop; `shutdown()` waiting for the next poll; "
        "readiness that fails only after the listener closed",
        extra_module="(its command-line example: `examples/server_shutdown_cli.py`)",
    ),
    Pattern(
        "Server shutdown with asyncio",
        "server_shutdown_asyncio",
        "17-server-shutdown-asyncio",
        "an asyncio server that won't stop, waits for a kept-alive client, or cuts requests "
        "in flight",
        "`asyncio.Server.close()` leaving connected clients served; `wait_closed()` returning "
        "at once on 3.11 and hanging on an idle keep-alive client on 3.12+; 3.13's "
        "`close_clients()` cutting requests in flight; an asyncio handler that swallows its "
        "cancel hanging the stop",
    ),
    Pattern(
        "Exit doctor",
        "exit_doctor",
        "15-exit-doctor",
        "`main` returned and the process is still there: which thread or hook holds it?",
        "a program that will not exit and no word of why: a non-daemon thread, a stuck "
        "executor task, a `multiprocessing.Queue` feeder, a blocking `atexit` handler or "
        "`asyncio.run` waiting for its default executor, named with its stack and where it "
        "was started",
        extra_module="(`examples/exit_doctor_use.py`; the hazards: `examples/exit_doctor/`)",
    ),
    Pattern(
        "Leak check",
        "leak_check",
        "16-leak-check",
        "a test passes but leaves a thread, process, task or socket running, and a later "
        "test or the exit pays for it",
        "a test that leaves a thread, child process, asyncio task or open fd running while "
        "a later test fails or the run hangs at exit; a leak report that names the thread but "
        "not the line that started it",
        extra_module="(the program at the top of its page: `examples/leak_check_use.py`)",
    ),
]


def _paths(paths: tuple[str, ...]) -> str:
    return ", ".join(f"`{p}`" for p in paths)


def readme_table() -> str:
    """The README's table, in Markdown: repository paths, as a checkout shows them."""
    lines = [
        "| pattern | pitfall it prevents | module | tests | docs page | notebook |",
        "|---|---|---|---|---|---|",
    ]
    for p in PATTERNS:
        module = f"`{p.module}` {p.extra_module}".rstrip()
        lines.append(
            f"| {p.name} | {p.pitfalls} | {module} | {_paths(p.tests)} "
            f"| `{p.page}` | `{p.notebook_path}` |"
        )
    return "\n".join(lines) + "\n"


def docs_table() -> list[str]:
    """The home page's table, in MyST Markdown: symptom, then page, notebook and module."""
    lines = [
        "```{container} pattern-index",
        "| what goes wrong | read | run | module |",
        "|---|---|---|---|",
    ]
    for p in PATTERNS:
        number = p.notebook.split("-", 1)[0]
        lines.append(
            f"| {p.symptom} | {{doc}}`{p.name} </patterns/{p.stem}>` "
            f"| {{doc}}`notebook {number} </notebooks/{p.notebook}>` "
            f"| {{py:mod}}`{p.stem}.py <patterns.{p.stem}>` |"
        )
    return [*lines, "```"]


def readme_with_table(readme: str) -> str:
    """``readme`` with the text between the table's markers replaced by `readme_table`."""
    head, start, rest = readme.partition(START)
    _, end, tail = rest.partition(END)
    if not (start and end):
        raise ValueError(f"the README lacks the markers {START!r} and {END!r}")
    return f"{head}{START}\n{readme_table()}{END}{tail}"


def main() -> None:
    """Rewrite the README's pattern table from `PATTERNS`."""
    readme = ROOT / "README.md"
    text = readme.read_text(encoding="utf-8")
    new = readme_with_table(text)
    if new != text:
        readme.write_text(new, encoding="utf-8")
        logging.getLogger(__name__).info("README.md: pattern table rewritten")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    main()
