"""The status page's rendering: HTML from a cluster status, and its stylesheet."""

from __future__ import annotations

from .page import error_page, status_page

__all__ = ["error_page", "status_page"]
