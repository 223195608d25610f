# Use it: a child process asked to stop, waited for up to 5 s, forced only as the last resort.
# The child ignores Ctrl-C (the parent decides how it stops); asked, it runs its finally.
# prints: child: working
# prints: child: cleaned up
# prints: terminated=True, escalation=''
import time

from patterns.stoppable_process import StoppableProcess, StopSignal


def work(stop: StopSignal, name: str) -> None:
    print(f"{name}: working", flush=True)
    try:
        while not stop.wait(0.1):  # a step of work between looks at the stop request
            pass
    finally:
        print(f"{name}: cleaned up", flush=True)


def main() -> None:
    with StoppableProcess(work, ("child",), stop_timeout=5) as child:
        time.sleep(0.5)  # the parent's own work; leaving the block stops the child
    report = child.stop()  # the report of the stop the with block made
    print(f"terminated={report.terminated}, escalation={report.escalation!r}")


if __name__ == "__main__":
    main()
