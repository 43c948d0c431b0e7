"""The second peer in bench/peer.py: a pgqueuer worker whose one entrypoint POSTs one message to the fake Letta.

    PEER_PG_DSN=postgresql://... LETTA_BASE_URL=http://... LETTA_API_KEY=k python -m bench.peer_pgqueuer 8 [--per-agent]

The entrypoint sends the same body PromptYoSelf's plain send does (one user message) to the same route
(``/v1/agents/{agent_id}/messages/async``) with one ``httpx.AsyncClient`` per worker process (kept-alive
connections, at most the in-flight limit of them), as bench/peer_worker.py does for procrastinate, and
fails on a non-2xx answer (pgqueuer then logs the exception and deletes the job: no retry). The job's
payload is JSON ``{"agent_id", "text"}``.

The worker runs as ``pgq run`` does (``pgqueuer.run`` on uvloop, pgqueuer's own signal handling, an
asyncpg connection: pgqueuer's documented driver) with ``max_concurrent_tasks`` = the in-flight limit
and ``batch_size`` = half of it (pgqueuer requires the cap to be at least twice the batch).

Per-agent serialization: pgqueuer has no per-job lock or key that serializes jobs (procrastinate's
``lock``; PromptYoSelf's one claim per agent). Its only limit is ``concurrency_limit`` per entrypoint
(``dedupe_key`` refuses a second queued job instead of serializing it). So by default the one
entrypoint ``post_message`` has no limit: pgqueuer as it is, one message per agent at a time not
guaranteed. With ``--per-agent`` the worker registers one entrypoint per agent (``post:<agent_id>``,
read from the loaded jobs) with ``concurrency_limit=1``: the nearest pgqueuer comes to the others.

The worker writes ``ready`` to stderr once its connection is open and its entrypoints registered, then
runs until SIGTERM.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import httpx
import pgqueuer
import uvloop
from pgqueuer.models import Job
from pgqueuer.qm import QueueManager
from pgqueuer.queries import Queries

ROUTE = "/v1/agents/{agent_id}/messages/async"
ENTRYPOINT = "post_message"
PER_AGENT_PREFIX = "post:"


def entrypoint_for(agent_id: str, per_agent: bool) -> str:
    """The entrypoint a job for ``agent_id`` is queued under."""
    return f"{PER_AGENT_PREFIX}{agent_id}" if per_agent else ENTRYPOINT


async def install_and_enqueue(dsn: str, jobs: list[tuple[str, str]], due_in: Any, per_agent: bool) -> None:
    """pgqueuer's schema (``Queries.install``, what ``pgq install`` runs) in the database at ``dsn``, then one
    job per ``(agent_id, text)``, in that order, in one batch, eligible ``due_in`` (a callable returning the
    timedelta to the due instant, read just before the insert) from now."""
    conn = await asyncpg.connect(dsn)
    try:
        queries = Queries.from_asyncpg_connection(conn)
        await queries.install()
        payloads: list[bytes | None] = [
            json.dumps({"agent_id": agent, "text": text}).encode() for agent, text in jobs
        ]
        after = due_in()
        await queries.enqueue(
            [entrypoint_for(agent, per_agent) for agent, _ in jobs], payloads, [0] * len(jobs),
            [after] * len(jobs),
        )
    finally:
        await conn.close()


def _factory(in_flight: int, per_agent: bool) -> Any:
    @asynccontextmanager
    async def create() -> AsyncIterator[QueueManager]:
        conn = await asyncpg.connect(os.environ["PEER_PG_DSN"])
        client = httpx.AsyncClient(
            base_url=os.environ["LETTA_BASE_URL"], timeout=30.0,
            headers={"Authorization": f"Bearer {os.environ.get('LETTA_API_KEY', '')}"},
            limits=httpx.Limits(max_connections=in_flight, max_keepalive_connections=in_flight),
        )
        qm = QueueManager(Queries.from_asyncpg_connection(conn))

        async def post_message(job: Job) -> None:
            body = json.loads(job.payload or b"{}")
            resp = await client.post(ROUTE.format(agent_id=body["agent_id"]),
                                     json={"messages": [{"role": "user", "content": body["text"]}]})
            resp.raise_for_status()

        if per_agent:
            rows = await conn.fetch("SELECT DISTINCT entrypoint FROM pgqueuer WHERE entrypoint LIKE $1",
                                    PER_AGENT_PREFIX + "%")
            for row in rows:
                qm.entrypoint(row["entrypoint"], concurrency_limit=1)(post_message)
        else:
            qm.entrypoint(ENTRYPOINT)(post_message)
        try:
            sys.stderr.write(f"ready ({len(qm.entrypoint_registry)} entrypoints)\n")
            sys.stderr.flush()
            yield qm
        finally:
            await client.aclose()
            await conn.close()

    return create


async def _main(in_flight: int, per_agent: bool) -> None:
    await pgqueuer.run(_factory(in_flight, per_agent), batch_size=max(1, in_flight // 2),
                       max_concurrent_tasks=in_flight, dequeue_timeout=timedelta(seconds=30))


if __name__ == "__main__":
    args = sys.argv[1:]
    uvloop.run(_main(int(args[0]) if args and args[0].isdigit() else 8, "--per-agent" in args))
