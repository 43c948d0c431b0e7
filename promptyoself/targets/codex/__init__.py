"""Target ``codex``: a Codex CLI session (OpenAI's ``codex``; docs/codex.md).

- ``session``: which session (thread) a call comes from, with no ids: the ``CODEX_THREAD_ID`` of a
  command run by the session's shell tool, else the rollout file the parent ``codex`` process holds
  open (our stdio MCP server's parent), read from ``$CODEX_HOME/sessions``; standard library only;
- ``target.CodexTarget``: delivery as a resumed headless turn (``codex exec --json resume <thread>``)
  in the session's directory, exactly once through a marker looked up in the session's rollout;
- ``install``: ``promptyoself codex install`` (our MCP server in Codex's ``config.toml``);
- ``plugin``: the plug-in object (entry point ``codex`` in the group ``promptyoself.targets``).
"""
