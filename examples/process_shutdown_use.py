# Use it: a process pool that shuts down within 2 s + 1 s, killing workers only if it must.
# A Ctrl-C reaches only this process (workers ignore SIGINT); the finally still shuts down.
# prints: results: [0, 1, 4, 9, 16, 25, 36, 49]
# prints: terminated=True
import os
from concurrent.futures import ProcessPoolExecutor

from patterns.process_shutdown import shutdown_process_pool
from patterns.stoppable_process import ignore_sigint


def main() -> None:
    pool = ProcessPoolExecutor(max_workers=2, initializer=ignore_sigint)
    try:
        print("results:", list(pool.map(pow, range(8), [2] * 8)))
    finally:
        report = shutdown_process_pool(pool, 2, force_timeout=1)
    print(f"terminated={report.terminated}, killed: {report.killed_pids}")
    if not report.terminated:  # a worker survived SIGKILL's wait: do not wait for it
        os._exit(3)


if __name__ == "__main__":
    main()
