# Use it: asyncio work that drains on the first SIGTERM or Ctrl-C; a second one exits at once.
# Here the work sends itself the SIGTERM that `docker stop` or a Ctrl-C would bring.
# prints: SIGTERM received: stopping
# prints: drained: finished=('work',), terminated=True
import asyncio
import logging
import os
import signal

from patterns.asyncio_signals import run_until_signalled


async def work(stop: asyncio.Event) -> None:
    print("serving", flush=True)
    os.kill(os.getpid(), signal.SIGTERM)  # as `docker stop` would
    await stop.wait()  # serve until asked to stop
    await asyncio.sleep(0.1)  # finish what is in flight, then return


async def main() -> None:
    report = await run_until_signalled(work, drain_timeout=5)
    print(f"drained: finished={report.finished}, terminated={report.terminated}")
    if not report.terminated:  # work caught its cancellation: do not wait for it
        os._exit(3)


logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
asyncio.run(main())
