"""The faces: how people and programs reach PromptYoSelf (MCP tools, the command line, HTTP).

A face parses its protocol, calls one core operation and renders the result or the error. It holds
no scheduling logic and no SQL; nothing else in the package imports a face (docs/design.md §Layers).
"""
