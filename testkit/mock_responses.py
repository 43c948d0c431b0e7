"""A mock of the OpenAI Responses API for the real Codex CLI (tests/codex_harness.py), on 127.0.0.1.

``POST /v1/responses`` answers with the server-sent events Codex reads: ``response.created``,
``response.output_item.added``, ``response.output_text.delta``, ``response.output_item.done`` and
``response.completed`` (with ``usage``). What it answers is decided from the **prompt**, the text of the
last user message in the request's ``input``:

* ``MOCK_TOOL_CALL {"name": "<tool>", "arguments": {...}}`` (several allowed): a ``function_call`` of the
  k-th directive's tool once k-1 ``function_call_output`` items follow the prompt (a tool named ``<tool>``,
  or ``<tool>`` inside a namespace such as ``mcp__<server>``, the call then carrying ``namespace``); after
  the last, the text ``MOCK_TOOL_DONE <tool>: <output>``. A tool the request does not offer:
  ``MOCK_TOOL_UNAVAILABLE <tool>``.
* otherwise ``MOCK_ACK <prompt, whitespace collapsed, 160 characters>``.
* ``MOCK_SLEEP <seconds>`` anywhere in the prompt: the answer waits that long first (a turn kept busy).

Every request is logged as one JSON line (``--log``): its prompt, how many input items it had, the
tools offered and what was answered. Run: ``python -m testkit.mock_responses --port 0 --log FILE``
(prints ``PORT <n>`` once listening).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DIRECTIVE = re.compile(r"MOCK_TOOL_CALL\s+(\{.*\})")
SLEEP = re.compile(r"MOCK_SLEEP\s+(\d+(?:\.\d+)?)")
USAGE = {"input_tokens": 120, "input_tokens_details": {"cached_tokens": 20}, "output_tokens": 30,
         "output_tokens_details": {"reasoning_tokens": 5}, "total_tokens": 150}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
    return ""


def prompt_of(items: list[Any]) -> tuple[str, int]:
    """The last user message's text, and the index of that item."""
    for i in range(len(items) - 1, -1, -1):
        item = items[i]
        if isinstance(item, dict) and item.get("role") == "user":
            text = _text(item.get("content"))
            if text.strip() and not text.lstrip().startswith(("<environment_context>", "<user_instructions>",
                                                               "# AGENTS.md")):
                return text, i
    return "", -1


def offered(tools: list[Any]) -> dict[str, tuple[str | None, str]]:
    """``{qualified name: (namespace, name)}`` of the tools a request offers (a namespace's tools are
    qualified ``<namespace>__<name>``: Codex offers an MCP server's tools as the namespace
    ``mcp__<server>``)."""
    found: dict[str, tuple[str | None, str]] = {}
    for tool in tools or ():
        if not isinstance(tool, dict) or not tool.get("name"):
            continue
        name = str(tool["name"])
        if tool.get("type") == "namespace":
            for inner in tool.get("tools", []) or []:
                if isinstance(inner, dict) and inner.get("name"):
                    found[f"{name}__{inner['name']}"] = (name, str(inner["name"]))
        else:
            found[name] = (None, name)
    return found


def tool_names(tools: list[Any]) -> list[str]:
    return list(offered(tools))


def decide(body: dict[str, Any]) -> dict[str, Any]:
    """``{"kind": "text", "text": ...}`` or ``{"kind": "call", "name", "arguments", "call_id"}``."""
    items = body.get("input") or []
    prompt, at = prompt_of(items)
    after = items[at + 1:] if at >= 0 else []
    outputs = [i for i in after if isinstance(i, dict) and i.get("type") == "function_call_output"]
    directives = []
    for m in DIRECTIVE.finditer(prompt):
        try:
            directives.append(json.loads(m.group(1)))
        except ValueError:
            directives.append({})
    if directives:
        done = len(outputs)
        if done >= len(directives):
            wanted = directives[-1]
            out = outputs[-1].get("output")
            if isinstance(out, list):  # an MCP tool's result: its content items
                text = "\n".join(str(i.get("text", "")) for i in out if isinstance(i, dict))
            else:
                text = out if isinstance(out, str) else json.dumps(out)
            return {"kind": "text", "text": f"MOCK_TOOL_DONE {wanted.get('name', '')}: {text[:4000]}"}
        wanted = directives[done]
        name = str(wanted.get("name", ""))
        tools = offered(body.get("tools") or [])
        found = next((t for t in tools if t == name or t.endswith("__" + name)), None)
        if found is None:
            return {"kind": "text", "text": f"MOCK_TOOL_UNAVAILABLE {name} (offered: {', '.join(tools)[:800]})"}
        namespace, inner = tools[found]
        return {"kind": "call", "name": inner, "namespace": namespace,
                "arguments": json.dumps(wanted.get("arguments", {})), "call_id": "call_" + uuid.uuid4().hex[:12]}
    return {"kind": "text", "text": "MOCK_ACK " + " ".join(prompt.split())[:160]}


class Handler(BaseHTTPRequestHandler):
    server: MockServer

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        body = json.dumps({"object": "list", "data": [{"id": "mock-model", "object": "model"}]}).encode()
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {}
        if not self.path.rstrip("/").endswith("/responses"):
            self.send_response(404)
            self.end_headers()
            return
        answer = decide(body)
        prompt, _ = prompt_of(body.get("input") or [])
        if self.server.log_path and os.environ.get("MOCK_DUMP"):
            with open(self.server.log_path + ".bodies", "a", encoding="utf-8") as fh:
                fh.write(json.dumps(body) + "\n")
        pause = SLEEP.search(prompt)
        if pause and answer["kind"] == "text":
            time.sleep(min(float(pause.group(1)), 120.0))
        self.server.record({"t": time.time(), "path": self.path, "prompt": prompt,
                            "items": len(body.get("input") or []), "tools": tool_names(body.get("tools") or []),
                            "answer": answer})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        rid = "resp_" + uuid.uuid4().hex[:16]
        if answer["kind"] == "call":
            item: dict[str, Any] = {"type": "function_call", "id": "fc_" + uuid.uuid4().hex[:12], "status": "completed",
                                    "name": answer["name"], "arguments": answer["arguments"],
                                    "call_id": answer["call_id"]}
            if answer.get("namespace"):
                item["namespace"] = answer["namespace"]
            events = [("response.created", {"response": {"id": rid}}),
                      ("response.output_item.added", {"output_index": 0, "item": {**item, "arguments": ""}}),
                      ("response.output_item.done", {"output_index": 0, "item": item})]
        else:
            mid = "msg_" + uuid.uuid4().hex[:12]
            text = answer["text"]
            done = {"type": "message", "id": mid, "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}]}
            events = [("response.created", {"response": {"id": rid}}),
                      ("response.output_item.added", {"output_index": 0,
                                                      "item": {**done, "status": "in_progress", "content": []}}),
                      ("response.output_text.delta", {"output_index": 0, "item_id": mid, "content_index": 0,
                                                      "delta": text}),
                      ("response.output_item.done", {"output_index": 0, "item": done})]
        events.append(("response.completed", {"response": {"id": rid, "usage": USAGE}}))
        for kind, data in events:
            payload = json.dumps({"type": kind, **data})
            self.wfile.write(f"event: {kind}\ndata: {payload}\n\n".encode())
            self.wfile.flush()


class MockServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, log: str | None) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        self.log_path = log
        self.lock = threading.Lock()

    def record(self, entry: dict[str, Any]) -> None:
        if not self.log_path:
            return
        with self.lock, open(self.log_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--log")
    a = ap.parse_args(argv)
    server = MockServer(a.port, a.log)
    sys.stdout.write(f"PORT {server.server_address[1]}\n")
    sys.stdout.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
