"""Coordination backends: who runs a tick, and no overlapping runs."""

from __future__ import annotations

from .base import Backend, Claim, ClaimRequest, ClaimStatus, Release, RunRecord, RunRequests
from .embedded import EmbeddedBackend
from .memory import MemoryBackend, MemoryState

__all__ = [
    "Backend",
    "Claim",
    "ClaimRequest",
    "ClaimStatus",
    "EmbeddedBackend",
    "MemoryBackend",
    "MemoryState",
    "Release",
    "RunRecord",
    "RunRequests",
]
