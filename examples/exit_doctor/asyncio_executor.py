"""Hazard: a blocking call in asyncio's default executor, still running when main() returns."""

import asyncio
import threading

release = threading.Event()
entered = threading.Event()


def blocking() -> None:
    """The call that holds the default executor's worker."""
    entered.set()
    release.wait()  # nobody sets it


async def main() -> None:
    """Start the blocking call, wait until it runs, and return."""
    asyncio.get_running_loop().run_in_executor(None, blocking)
    await asyncio.to_thread(entered.wait)
    print("main done", flush=True)  # noqa: T201 - the program speaks


asyncio.run(main())  # waits for the default executor's threads before it returns
