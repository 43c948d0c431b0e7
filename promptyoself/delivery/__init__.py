"""Delivery: the engine (``delivery.engine``: one entry point, ``Engine.run()``, that every way of
delivering runs) that claims due occurrences, sends them to their target and records each attempt; the
retry policy; the worker and its lease; who delivers (docs/design.md §6, docs/architecture.md).
"""
