# Use it: keep background tasks in a TaskSet; leaving the block cancels them within 2 s.
# A Ctrl-C cancels main(); the async with block still stops the tasks.
# prints: cancelled=('tick-0', 'tick-1', 'tick-2'), terminated=True
import asyncio
import logging
import os

from patterns.asyncio_shutdown import TaskSet


async def tick() -> None:
    while True:
        await asyncio.sleep(0.01)


async def main() -> None:
    async with TaskSet(stop_timeout=2) as tasks:
        for n in range(3):
            tasks.spawn(tick(), name=f"tick-{n}")
        await asyncio.sleep(0.1)  # main's own work
    report = await tasks.stop()  # the report of the stop the block made
    print(f"cancelled={tuple(sorted(report.cancelled))}, terminated={report.terminated}")
    if not report.terminated:  # a task caught its cancellation: do not wait for it
        os._exit(3)


logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
asyncio.run(main())
