"""Storage: the models, the engine, the migrations and every SQL statement the program runs.

Everything above this package gets plain records back, never a session (docs/design.md §Storage).
"""
