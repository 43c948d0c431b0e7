"""The core: every operation behind the tools, the CLI and the HTTP API, with agent inference,
argument checks and typed results. It speaks no protocol and writes no SQL (docs/design.md §Layers).
"""
