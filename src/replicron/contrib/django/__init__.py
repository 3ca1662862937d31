"""replicron for Django (``pip install 'replicron[django]'``): jobs declared in the apps'
``jobs.py``, run exactly once across the project's replicas; ``manage.py replicron``;
replicron's tables created by ``manage.py migrate``; jobs, runs and replicas in the admin.
See docs/django.md."""

from __future__ import annotations

from .declare import job

__all__ = ["job"]
