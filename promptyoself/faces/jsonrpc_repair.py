"""A JSON-RPC line with a lone surrogate (``"\\ud800"``) still gets an answer.

JSON allows the escape; the MCP SDK's parser (pydantic's, strict UTF-8) refuses the whole line, and the
stdio transport then drops it without a word: the client waits for a reply that never comes. Here
such a line is made parseable (each lone surrogate becomes U+FFFD) and, in a ``tools/call``, the
places it held one are named in ``params._meta["promptyoself/invalid_unicode"]``, which
``faces.mcp.ArgumentErrors`` answers as ``invalid_argument`` before the tool runs. Other requests
(an ``initialize`` whose client name held one) go on with the replacement character.

``install()`` puts this in front of the parser of ``mcp.server.stdio`` (the in-process stdio server
and the stdio relay's sessions both read lines there); lines that parse are never touched.
"""

from __future__ import annotations

import json
import re
from typing import Any

MARK = "promptyoself/invalid_unicode"
_LONE = re.compile("[\ud800-\udfff]")


def _walk(value: Any, path: str, found: list[str]) -> Any:
    if isinstance(value, str):
        if _LONE.search(value):
            found.append(path or "the request")
            return _LONE.sub("\ufffd", value)
        return value
    if isinstance(value, list):
        return [_walk(v, f"{path}[{i}]", found) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {_walk(k, path, found): _walk(v, f"{path}.{k}" if path else str(k), found) for k, v in value.items()}
    return value


def repair_line(line: str | bytes) -> str | None:
    """``line`` with its lone surrogates replaced (and, in a ``tools/call``, named for the answer), or
    None when it holds none (or is not JSON at all: the parser's own error stands)."""
    text = line.decode("utf-8", errors="replace") if isinstance(line, bytes) else line
    if "\\u" not in text.lower() and not _LONE.search(text):
        return None
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    found: list[str] = []
    fixed = _walk(obj, "", found)
    if not found:
        return None
    if isinstance(fixed, dict) and fixed.get("method") == "tools/call" and isinstance(fixed.get("params"), dict):
        params = fixed["params"]
        meta = params.get("_meta") if isinstance(params.get("_meta"), dict) else {}
        names = [p.removeprefix("params.") for p in found]
        params["_meta"] = {**meta, MARK: ", ".join(names[:5])}
    return json.dumps(fixed, ensure_ascii=False)


class _Adapter:
    """The SDK's message adapter, trying a repaired line when a line does not parse."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def validate_json(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return self._inner.validate_json(data, *args, **kwargs)
        except ValueError:  # pydantic's ValidationError
            fixed = repair_line(data) if isinstance(data, str | bytes) else None
            if fixed is None:
                raise
            return self._inner.validate_json(fixed, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Types:
    """``mcp_types`` as ``mcp.server.stdio`` sees it, with the repairing adapter."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.jsonrpc_message_adapter = _Adapter(inner.jsonrpc_message_adapter)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def install() -> None:
    """Once per process; a no-op where the SDK reads its lines differently."""
    import mcp.server.stdio as stdio

    current = getattr(stdio, "types", None)
    if current is None or isinstance(current, _Types) or not hasattr(current, "jsonrpc_message_adapter"):
        return
    stdio.types = _Types(current)  # type: ignore[attr-defined]
