"""Target ``letta-code``: an agent of a Letta Code App Server (PyPI ``letta`` >= 0.32, ``LETTA_CODE_URL``,
``agent-local-...`` agents; docs/letta-code.md).

- ``client.LettaCodeClient`` speaks the App Server's WebSocket; ``target.LettaCodeTarget`` delivers
  through it (``client_message_id`` = the occurrence id, looked up before a re-send);
- ``install`` holds ``promptyoself letta-code install|uninstall`` (a skill and our MCP entry);
- the plug-in (``plugin``): an ``agent-local-...`` agent lives in a Letta Code App Server, never behind
  the Letta REST API, so a call for one that names no target comes here, and its agent is checked
  there, whatever ``LETTA_BASE_URL`` says (Letta Code sets ``LETTA_BASE_URL=https://api.letta.com`` in
  its agents' Bash environment).
"""
