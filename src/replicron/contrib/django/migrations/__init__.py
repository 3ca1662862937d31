"""Part of the replicron Django app."""

from __future__ import annotations

__all__: list[str] = []
