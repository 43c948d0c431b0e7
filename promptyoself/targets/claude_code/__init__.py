"""Target ``claude-code``: a Claude Code session (docs/claude-code.md).

- ``session``: which session a schedule made from inside Claude Code belongs to (the process tree,
  ``sessions/<pid>.json``, the environment), and ``claude-code install``;
- ``install``: our server as a Claude Code plugin (live delivery through Channels);
- ``target.ClaudeCodeTarget``: delivery, live into an open idle session through its channel
  (``channel``: the socket, the idle check and the client) or as a resumed headless turn;
- ``channel_server``: the stdio MCP server's half of live delivery (the ``claude/channel``
  capability and the private socket), run by its ``serve_stdio`` (our ``promptyoself.stdio`` entry
  point) when this server is a Claude Code plugin.
"""
