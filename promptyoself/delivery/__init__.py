"""Delivery: the loop that claims due occurrences, sends them to Letta and records each attempt; the
retry policy; the worker and its lease; the entry points that start and stop them (docs/design.md §Delivery).
"""
