"""Integrations with frameworks, each installed with its extra (``replicron[django]``)."""

from __future__ import annotations

__all__: list[str] = []
