"""The peer in bench/peer.py: a procrastinate worker whose one task POSTs one message to the fake Letta.

    PEER_PG_DSN=postgresql://... LETTA_BASE_URL=http://... LETTA_API_KEY=k python -m bench.peer_worker 8

The task (``post_message``) sends the same body PromptYoSelf's plain send does (one user message) to
the same route (``/v1/agents/{agent_id}/messages/async``) with one ``httpx.AsyncClient`` per worker
process (kept-alive connections, at most ``concurrency`` of them), and fails on a non-2xx answer.
Jobs of one agent carry that agent as their procrastinate ``lock``, so, as in PromptYoSelf, an agent
gets one message at a time. The worker writes ``ready`` to stderr once its app is open, then runs
until SIGTERM (procrastinate's own handler stops it gracefully).
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import httpx
import procrastinate

ROUTE = "/v1/agents/{agent_id}/messages/async"
_client: httpx.AsyncClient | None = None
_limit = 8


def make_app(dsn: str, pool_max: int = 10) -> Any:
    """The procrastinate app on ``dsn`` with the one task registered."""
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn, min_size=1, max_size=pool_max))

    @app.task(name="post_message")
    async def post_message(agent_id: str, text: str) -> None:
        global _client
        if _client is None:
            _client = httpx.AsyncClient(
                base_url=os.environ["LETTA_BASE_URL"], timeout=30.0,
                headers={"Authorization": f"Bearer {os.environ.get('LETTA_API_KEY', '')}"},
                limits=httpx.Limits(max_connections=_limit, max_keepalive_connections=_limit),
            )
        resp = await _client.post(ROUTE.format(agent_id=agent_id),
                                  json={"messages": [{"role": "user", "content": text}]})
        resp.raise_for_status()

    return app


async def _main(concurrency: int) -> None:
    global _limit
    _limit = concurrency
    app = make_app(os.environ["PEER_PG_DSN"], pool_max=concurrency + 2)
    async with app.open_async():
        sys.stderr.write("ready\n")
        sys.stderr.flush()
        # Polled every 50 ms while idle: the jobs are scheduled for one instant, which no NOTIFY announces.
        await app.run_worker_async(concurrency=concurrency, fetch_job_polling_interval=0.05,
                                   wait=True, install_signal_handlers=True)


if __name__ == "__main__":
    asyncio.run(_main(int(sys.argv[1]) if len(sys.argv) > 1 else 8))
