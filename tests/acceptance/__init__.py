"""Acceptance tests: several real replica processes against a real PostgreSQL, in real time."""
