# Use it: consumer tasks on a closable asyncio queue; stop() drains it within 2 s.
# A Ctrl-C cancels main(); the async with block still stops the pool.
# prints: processed=10, terminated=True
import asyncio
import logging
import os

from patterns.async_queue import AsyncConsumerPool


async def handle(item: int) -> None:
    await asyncio.sleep(0.01)


async def main() -> None:
    async with AsyncConsumerPool(handle, consumers=3, stop_timeout=2) as pool:
        for n in range(10):
            await pool.put(n)
    report = await pool.stop()  # the report of the stop the block made
    print(f"processed={report.processed}, terminated={report.terminated}")
    if not report.terminated:  # a task ignored its cancellation: do not wait for it
        os._exit(3)


logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
asyncio.run(main())
