# Use it: install the exit doctor early; if the exit hangs, it says why, then ends the process.
# prints: main: work finished
# prints: non-daemon thread 'metrics-uploader'
# exit status: 3
import sys
import threading

from patterns import exit_doctor

# After main returns (or SIGTERM/SIGINT arrives), wait 2 s; then report and exit with status 3.
doctor = exit_doctor.install(after=2.0, kill=True, stream=sys.stderr)

uploads_done = threading.Event()


def upload_metrics() -> None:
    uploads_done.wait()  # the bug: nothing ever sets it, and the thread is not a daemon


threading.Thread(target=upload_metrics, name="metrics-uploader").start()
print("main: work finished", flush=True)  # flushed: os._exit drops buffers
# Exit status 3 and a report naming "metrics-uploader", where it was started and where it waits:
# the fix is to stop the thread from main (docs/patterns/daemon_threads.md).
