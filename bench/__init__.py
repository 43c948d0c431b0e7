"""Benchmarks: ``python -m bench`` runs every section, prints a table and writes docs/performance.md."""
