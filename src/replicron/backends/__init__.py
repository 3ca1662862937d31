"""Coordination backends: who runs a tick, and no overlapping runs."""

from __future__ import annotations

from .base import Backend, Claim, ClaimRequest, ClaimStatus, Release, RunRecord
from .memory import MemoryBackend, MemoryState

__all__ = [
    "Backend",
    "Claim",
    "ClaimRequest",
    "ClaimStatus",
    "MemoryBackend",
    "MemoryState",
    "Release",
    "RunRecord",
]
