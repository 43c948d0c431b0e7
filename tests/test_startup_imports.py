"""Start-up stays light: what the MCP handshake does not need is not imported before it (issue 4).

SQLAlchemy, Alembic, httpx, croniter, dateutil, cron_descriptor and the delivery modules load on first
use (a tool call, or the delivery side after the handshake: promptyoself/faces/deferred.py); so do the
schedule operations with the rule parsers they bring (``Core.scheduling``), and the targets' plug-ins
with ``targets.base`` (the start reads only the registry's entry points: the tools' target list and
the stdio hooks). The cold-start figure in docs/performance.md depends on it; bench/startup.py
measures it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from promptyoself.targets import registry

pytestmark = pytest.mark.slow  # real servers or processes (tests/conftest.py: tiers)

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("sqlalchemy", "alembic", "httpx", "httptools", "croniter", "dateutil", "cron_descriptor", "psycopg",
         "promptyoself.store.db", "promptyoself.delivery.service", "promptyoself.faces.delivery",
         "promptyoself.delivery.worker", "promptyoself.delivery.attempt", "promptyoself.delivery.engine",
         "promptyoself.letta.client", "promptyoself.core.scheduling", "promptyoself.recurrence",
         "promptyoself.phrases", "promptyoself.targets.base",
         *sorted({value.partition(":")[0] for value in registry.BUILT_IN.values()}))

PROBE = """
import json, sys
from fastmcp import FastMCP

def run(self, *args, **kwargs):  # stands in for serving: report what start-up imported
    heavy = sorted({m for m in sys.modules for h in HEAVY if m == h or m.startswith(h + ".")})
    sys.stdout.write(json.dumps({"heavy": heavy}))

FastMCP.run = run
from promptyoself.faces.serve import main
main([])
"""


@pytest.mark.parametrize("mode", ["worker", "embedded", "off"])
def test_serving_starts_without_the_heavy_modules(tmp_path: Path, mode: str) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PROMPTYOSELF_DB": str(tmp_path / "p.db"),
        "PROMPTYOSELF_EXECUTOR_MODE": mode,
        "PROMPTYOSELF_ENV_FILE": str(tmp_path / "none.env"),
    }
    code = f"HEAVY = {HEAVY!r}\n{PROBE}"
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["heavy"] == []
