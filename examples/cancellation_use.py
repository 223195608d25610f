# Use it: hand a task a token; cancelling it stops the task at its next checkpoint.
# prints: stopped early: enough
# prints: the task ended
import threading

from patterns.cancellation import Cancelled, CancelToken


def count(token: CancelToken, started: threading.Event) -> None:
    steps = 0
    started.set()
    try:
        while True:
            token.check()  # a checkpoint: raises Cancelled once the token is cancelled
            steps += 1
            token.sleep(0.01)  # a sleep that cancel() cuts short
    except Cancelled as exc:
        print(f"stopped early: {exc.reason} (after {steps} steps)")


token, started = CancelToken(timeout=30), threading.Event()  # a deadline cancels it too
worker = threading.Thread(target=count, args=(token, started))
worker.start()
try:  # a Ctrl-C here still cancels the token, in the finally
    started.wait()
finally:
    token.cancel("enough")
    worker.join(timeout=5)
print("the task ended" if not worker.is_alive() else "the task ignores its token")
