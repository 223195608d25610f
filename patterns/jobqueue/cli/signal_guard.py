"""The worker command's signals while no worker handles them: during start-up and after the stop.

TL;DR: ``guard = SignalGuard(prog).install()`` is the first thing ``python -m
patterns.jobqueue`` does, before the 0.1 s of imports: a SIGTERM, SIGINT or SIGHUP that
arrives then is recorded (a second one exits at once with 128 + its number), and the
command takes it with `SignalGuard.hand_over` once its own handlers are installed: the
worker then stops before it claims anything. Once the worker's handlers are put back
after the stop, the guard's are there again and ignore those signals (one line each),
so the exit status stays the report's. ``ignore_until_exit()``, once the command has
returned, hands those signals to the kernel's SIG_IGN for the interpreter's exit, whose
finalization would otherwise put their default action (death) back before the process
ends. ``release()`` gives a command that is not ``worker`` the default handlers back, and
redelivers what was recorded.

SIGUSR1 asks for the worker's state. While a worker runs, the command's dispatcher thread
answers it and sets `SignalGuard.report_status` to a silent callback; otherwise the guard
says "starting up" or "exiting". Either way its handler stays, so SIGUSR1 never kills.

Only `signal` and `os` (already loaded by the interpreter) are imported here: the
handlers must be in place long before the worker's modules are.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from types import FrameType

__all__ = ["STATUS_SIGNAL", "STOP_SIGNALS", "SignalGuard"]

#: The signals that stop a worker (a supervisor's, Ctrl-C, and the hang-up of its terminal).
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

#: The signal that asks a running worker for one line of its state.
STATUS_SIGNAL: signal.Signals = signal.SIGUSR1

_Handler = Callable[[int, FrameType | None], object] | int | signal.Handlers | None


class SignalGuard:
    """Holds `STOP_SIGNALS` and `STATUS_SIGNAL` for the process while no worker handles them.

    Its handler runs in the main thread, between two bytecodes of whatever it was doing,
    so it takes no lock and does no I/O but one ``os.write`` to stderr. Every field below
    is written by the main thread only (the handler, or the command between handlers).
    """

    def __init__(self, prog: str) -> None:
        self._prog = prog
        self._previous: dict[signal.Signals, _Handler] = {}
        self._early: list[signal.Signals] = []  # stop signals before hand_over()
        self._handed_over = False  # from hand_over() on, a stop signal here is late
        #: Called by SIGUSR1 instead of the guard's line (set and cleared by the command;
        #: it runs in a signal handler, so it must take no lock).
        self.report_status: Callable[[], object] | None = None

    def install(self) -> SignalGuard:
        """Put the guard's handler on every signal it holds (main thread only)."""
        for signum in (*STOP_SIGNALS, STATUS_SIGNAL):
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def hand_over(self) -> signal.Signals | None:
        """The first stop signal that came before now, if any; later ones came after the stop.

        Call it once the command's own handlers for `STOP_SIGNALS` are installed: a
        signal that reaches the guard from then on arrived after those were put back.
        """
        self._handed_over = True
        return self._early[0] if self._early else None

    def release(self) -> None:
        """Put back the handlers the guard replaced, then redeliver the first early signal.

        For a command that is not ``worker``: it gets the default actions (SIGINT raises
        `KeyboardInterrupt` here), as if the guard had never been there.
        """
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
        if self._early and not self._handed_over:
            signal.raise_signal(self._early[0])

    def ignore_until_exit(self) -> None:
        """Ignore the signals the guard still holds, silently, until the process exits.

        Call it once the command has returned (main thread only). The interpreter's
        finalization sets every signal that has a Python-level handler back to SIG_DFL
        before the process ends (``_PySignal_Fini``), so a stop signal in those last
        milliseconds would kill the process and change its exit status. SIG_IGN is the
        one disposition finalization leaves alone; the cost is the "ignored" line. A
        command whose handlers the guard released keeps the default actions.
        """
        for signum in self._previous:
            signal.signal(signum, signal.SIG_IGN)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if signum == STATUS_SIGNAL:
            report = self.report_status
            if report is not None:
                report()
            elif self._handed_over:
                self._say(f"{name}: the worker has stopped; exiting")
            else:
                self._say(f"{name}: starting up, no worker yet")
            return
        if self._handed_over:
            self._say(f"{name} ignored: the worker has stopped and the process is exiting")
            return
        self._early.append(signal.Signals(signum))
        if len(self._early) > 1:
            # Nothing has started that a stop would need to end: exit as a second signal does.
            self._say(f"second signal ({name}) during start-up: exiting at once")
            os._exit(128 + signum)

    def _say(self, text: str) -> None:
        try:  # noqa: SIM105 - contextlib is one more import before the handlers are in
            os.write(2, f"{self._prog}: {text}\n".encode())
        except OSError:  # no stderr to write to: the line is all that is lost
            pass
