# Use it: an asyncio server whose stop lets the request in flight finish, within stop_timeout.
# On SIGTERM, call the same stop (loop.add_signal_handler); here the program stops itself.
# prints: answer=b'done GET /slow\n'
# prints: terminated=True
import asyncio
import os

from patterns.server_shutdown_asyncio import AsyncConnection, AsyncGracefulServer

in_flight = asyncio.Event()


async def handle(conn: AsyncConnection) -> None:
    while line := await conn.reader.readline():  # one request a line, until the client hangs up
        with conn.request(line.decode().strip()):  # raises ServerStopping once a stop began
            in_flight.set()
            await asyncio.sleep(0.5)  # the work
            conn.writer.write(b"done " + line)


async def main() -> None:
    async with AsyncGracefulServer(handle, stop_timeout=2) as server:
        reader, writer = await asyncio.open_connection(*server.address)
        writer.write(b"GET /slow\n")
        await in_flight.wait()
        report = await server.stop()  # the request finishes; then its connection is closed
    print(f"answer={await reader.readline()!r}", report)
    writer.close()
    if not report.terminated:  # a handler swallowed its cancellation: do not wait for it
        os._exit(3)


asyncio.run(main())
