"""faces/tables.py draws through rich (issue 45 point 4): what a person at a terminal sees, in process.

The terminal itself (a pseudo-terminal around the real command) is tests/test_cli_terminal.py's.
"""

from __future__ import annotations

from promptyoself.faces import tables

AGENT = "agent-11111111-2222-3333-4444-000000000001"
LONG = " ".join(f"word{i:03d}" for i in range(60))


def listed(*prompts: str) -> dict[str, object]:
    rows = [{"id": n, "agent_id": AGENT, "target": "letta", "schedule_type": "cron", "schedule_value": "0 9 * * *",
             "timezone": "Asia/Kolkata", "state": "active", "next_run": "2026-12-01T03:30:00+00:00",
             "prompt_text": prompt} for n, prompt in enumerate(prompts, 1)]
    return {"status": "success", "schedules": rows, "count": len(rows), "total": len(rows)}


def test_a_wide_terminal_gets_one_table_with_the_prompt_wrapped_in_its_column() -> None:
    lines = tables.render(listed(LONG, "short"), None, 250).splitlines()
    assert lines[0].split() == ["ID", "AGENT", "TARGET", "TYPE", "RULE", "ZONE", "STATE", "NEXT", "RUN", "PROMPT"]
    column = lines[0].index("PROMPT")
    first = [line for line in lines if AGENT in line]
    assert len(first) == 2 and all(line.index("2026-12-01 09:00:00 +05:30 IST") < column for line in first)
    words = [line[column:].split() for line in lines[1:] if line.startswith(" ")]  # the prompt's next lines
    assert words and all(w.startswith("word") for line in words for w in line)
    assert all(len(line) <= 250 for line in lines)
    assert " ".join(" ".join(line.split()) for line in lines).count("word") == 60


def test_a_narrow_terminal_gets_a_block_per_row_with_ids_whole() -> None:
    for width in (60, 100):
        lines = tables.render(listed(LONG, "short"), None, width).splitlines()
        assert all(len(line) <= width for line in lines), lines
        assert [line.split()[-1] for line in lines if line.startswith("agent ")] == [AGENT, AGENT]
        assert lines.count("") == 1  # one blank line between the two rows
        assert "next run  2026-12-01 09:00:00 +05:30 IST" in lines
        assert " ".join(lines).split().count("word059") == 1
        assert lines[-1] == "2 of 2 schedules shown (all agents)."


def test_text_is_never_read_as_rich_markup_or_an_escape() -> None:
    text = tables.render(listed("[bold red]hi[/] :smile: \x1b[2J"), None, 250)
    assert "[bold red]hi[/] :smile: \\x1b[2J" in text and "\x1b" not in text


def test_a_single_result_is_key_value_lines_with_a_long_key_on_its_own_line() -> None:
    lines = tables.render({"status": "ok", "worker": {"pid": 12, "running": True}, "id": AGENT,
                           "guardrails": {"max_deliveries_per_agent_per_day": 500}}, None, 80).splitlines()
    assert lines[0].split() == ["status", "ok"] and lines[1].split() == ["worker.pid", "12"]
    assert lines[0].index("ok") == lines[1].index("12")  # the values in one column
    assert any(line.split() == ["worker.running", "yes"] for line in lines)
    assert any(line.split() == ["id", AGENT] for line in lines)
    key = lines.index("guardrails.max_deliveries_per_agent_per_day")
    assert lines[key + 1].strip() == "500"
    # narrower than key + id: the id goes whole on a line of its own
    narrow = tables.render({"id": AGENT, "a_long_key_name_here": 1}, None, 60).splitlines()
    assert narrow[narrow.index("id") + 1].strip() == AGENT
