"""The result types of the delivery tools (``promptyoself_execute``, ``promptyoself_executor_status``):
FastMCP turns them into the tools' output schemas. Light on purpose (typing only), so the MCP server
declares its tools without loading the delivery side."""

from __future__ import annotations

from typing import Any, NotRequired

from typing_extensions import TypedDict


class ExecutedItem(TypedDict):
    id: int
    agent_id: str
    delivered: bool
    next_run: str | None
    repetition_count: int
    max_repetitions: int | None
    completed: bool
    error: NotRequired[str | None]
    outcome: NotRequired[str]  # delivered | retry | failed | missed | paused | lost
    attempt: NotRequired[int]
    state: NotRequired[str | None]
    letta_run_id: NotRequired[str | None]


class ExecuteResult(TypedDict):
    status: str
    executed: NotRequired[list[ExecutedItem]]
    message: str
    running: NotRequired[bool]
    interval: NotRequired[float]


class ExecutorStatus(TypedDict):
    status: str
    running: bool
    interval: float
    last_tick: str | None
    next_due: str | None
    due_now: int
    delivered_total: int
    failed_total: int
    retry_total: NotRequired[int]
    missed_total: NotRequired[int]
    mode: NotRequired[str]
    executor: NotRequired[dict[str, Any] | None]
    worker: NotRequired[dict[str, Any] | None]
    auth_error: NotRequired[str | None]
