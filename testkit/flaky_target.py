"""An outside target plug-in for the torture test (issue 41: a plug-in is delivered exactly once under
faults, kills and stalls). ``install(site)`` lays it out as pip would leave a distribution, a module and
a ``*.dist-info`` whose ``entry_points.txt`` declares ``flaky = flaky_target:plugin`` in the group
``promptyoself.targets``; put ``site`` on ``PYTHONPATH`` and every PromptYoSelf process loads it.

It is docs/plugins.md's JSON-lines target with faults: each send fails before writing (transient), or
writes and then fails in doubt (as a receiver that took the prompt and dropped the answer), or writes
slowly, at ``FLAKY_FAIL_RATE`` (each process draws from ``FLAKY_SEED`` and its pid). Every line is
appended with ``O_APPEND`` and fsynced, so concurrent processes never interleave lines; ``lookup`` finds
an occurrence by its id. The file is ``FLAKY_TARGET_FILE``.
"""

from __future__ import annotations

from pathlib import Path

SOURCE = '''
import asyncio
import json
import os
import random
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from promptyoself.errors import NotSent, TargetUnavailable
from promptyoself.targets.base import Call, Destination, Fence, Found, Occurrence, Sent, Watch


class FlakyOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tag: str = Field(default="prompt", max_length=40, description="a word written with each line")


class FlakyTarget:
    name = "flaky"

    def __init__(self, settings: Any) -> None:
        self.path = Path(os.environ["FLAKY_TARGET_FILE"])
        self.rate = float(os.environ.get("FLAKY_FAIL_RATE", "0.2"))
        self.rng = random.Random(f"{os.environ.get('FLAKY_SEED', '0')}-{os.getpid()}")
        self.faults: dict[str, int] = {}

    def _fault(self) -> str | None:
        if self.rng.random() >= self.rate:
            return None
        return self.rng.choice(("before", "after", "slow"))

    async def send(self, occ: Occurrence, fence: Fence) -> Sent:
        fault = self._fault()
        if fault == "before":
            raise TargetUnavailable("flaky: refused before writing")
        line = json.dumps({"id": occ.occurrence_id, "schedule": occ.schedule_id, "tag": occ.options.get("tag"),
                           "text": occ.prompt, "pid": os.getpid(), "at": time.time()}) + "\\n"
        if fault == "slow":
            await asyncio.sleep(0.3)
        await asyncio.to_thread(self._append, line, fence)
        if fault == "after":
            raise TargetUnavailable("flaky: wrote it, then dropped the answer", in_doubt=True)
        return Sent(route="file")

    def _append(self, line: str, fence: Fence) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            if not fence():  # asked in the writing thread, right before the write (no hop after it)
                raise NotSent("the claim is no longer ours")
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    async def lookup(self, occ: Occurrence) -> Found:
        text = await asyncio.to_thread(lambda: self.path.read_text() if self.path.exists() else "")
        return Found("found" if f'"id": "{occ.occurrence_id}"' in text else "absent")

    async def probe(self) -> None:
        await asyncio.to_thread(self.path.parent.stat)

    def readiness(self) -> str:
        return f"flaky JSON lines at {self.path}"

    async def aclose(self) -> None:
        return None


class FlakyPlugin:
    name = "flaky"
    summary = "JSON lines in a file, with faults (the torture test's outside plug-in)"
    options = FlakyOptions
    aliases = ()

    def claims(self, call: Call) -> bool:
        return False

    def destination(self, call: Call) -> Destination:
        return Destination(call.agent(), {"tag": call.options.tag})

    def validate(self, core: Any, agent_id: str) -> None:
        return None

    def create(self, settings: Any) -> FlakyTarget:
        return FlakyTarget(settings)

    def watch(self, settings: Any) -> Watch:
        return Watch("flaky_unwritable", "Make the folder of FLAKY_TARGET_FILE writable.")


plugin = FlakyPlugin()
'''


def install(site: Path) -> Path:
    """The plug-in as an installed distribution in ``site`` (a folder to put on ``PYTHONPATH``)."""
    site.mkdir(parents=True, exist_ok=True)
    (site / "flaky_target.py").write_text(SOURCE, encoding="utf-8")
    info = site / "flaky_target-1.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: flaky-target\nVersion: 1.0\n", encoding="utf-8")
    (info / "entry_points.txt").write_text("[promptyoself.targets]\nflaky = flaky_target:plugin\n", encoding="utf-8")
    return site
