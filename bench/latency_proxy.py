#!/usr/bin/env python3
"""A TCP forwarder that delays every byte by a fixed time each way: a WAN link on loopback.

Each chunk read from one side is written to the other --delay-ms later, in order, so a
pipelined or multiplexed connection keeps its order and a round trip costs 2 x delay.
Used by bench/heal_wan.py (this kernel has no netem qdisc).

Usage: python3 bench/latency_proxy.py --listen PORT --to PORT --delay-ms 10
"""

import argparse
import asyncio


async def forward(reader, writer, delay: float):
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    async def send():
        while True:
            due, data = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                writer.close()
                return
            writer.write(data)
            await writer.drain()

    sender = asyncio.create_task(send())
    try:
        while True:
            data = await reader.read(1 << 16)
            await queue.put((loop.time() + delay, data))
            if not data:
                break
        await sender
    except (ConnectionError, asyncio.CancelledError):
        sender.cancel()
        writer.close()


async def main(listen: int, to: int, delay: float):
    async def accept(client_r, client_w):
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", to)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(forward(client_r, server_w, delay), forward(server_r, client_w, delay),
                             return_exceptions=True)

    server = await asyncio.start_server(accept, "127.0.0.1", listen)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--listen", type=int, required=True)
    ap.add_argument("--to", type=int, required=True)
    ap.add_argument("--delay-ms", type=float, default=10)
    a = ap.parse_args()
    asyncio.run(main(a.listen, a.to, a.delay_ms / 1000))
