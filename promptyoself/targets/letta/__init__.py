"""Target ``letta``: the Letta REST API (self-hosted Letta 0.16.x, or Letta Cloud), the default target.

The plug-in (``plugin``, declared in pyproject's ``promptyoself.targets`` entry points): a schedule's
destination is an agent as the core infers it (``agent-<uuid>``), checked on Letta before it is
stored; delivery is ``target.LettaRestTarget`` (``otid`` per occurrence, looked up before a re-send).
The Letta client itself is ``promptyoself.letta`` (shared with the Letta-compatible faces: native
tools, Letta's scheduling routes, the pass-through).
"""
