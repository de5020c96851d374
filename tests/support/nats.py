"""Run async NATS work from a synchronous test (DAG tests run ``dag.test()`` outside a loop)."""

from __future__ import annotations

import asyncio


def run_with_nats(settings, coro_fn):
    """Connect with ``settings``, return ``await coro_fn(nc)``, always close the connection."""

    async def go():
        nc = await settings.connect()
        try:
            return await coro_fn(nc)
        finally:
            await nc.close()

    return asyncio.run(go())
