"""Test support shared by tests/ and bench/ (not installed with the package): the fake Letta."""
