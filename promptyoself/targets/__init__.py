"""Delivery targets as plug-ins (DESIGN §13, issue 30 point 3).

A target owns one protocol that reaches an agent (Letta REST, Letta Code, Claude Code, webhooks).
The engine names no target: it asks ``registry.get(name)`` for the schedule's ``target`` and talks to
it only through ``base.DeliveryTarget``. A new target is one module here plus one registration line.
"""
