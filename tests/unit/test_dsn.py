"""Passwords never appear in what replicron prints."""

from __future__ import annotations

import pytest

from replicron._dsn import mask_dsn


@pytest.mark.parametrize(
    ("dsn", "masked"),
    [
        ("postgresql://app:s3cret@db:5432/jobs", "postgresql://app:***@db:5432/jobs"),
        ("postgres://app:p%40ss@db/jobs?sslmode=require", "postgres://app:***@db/jobs?sslmode=require"),
        ("postgresql://app@db/jobs", "postgresql://app@db/jobs"),
        ("host=db user=app password=s3cret dbname=x", "host=db user=app password=*** dbname=x"),
        ("host=db password = 'with space' dbname=jobs", "host=db password = *** dbname=jobs"),
        ("error at postgresql://u:pw@h/d: refused", "error at postgresql://u:***@h/d: refused"),
    ],
)  # fmt: skip
def test_mask_dsn(dsn: str, masked: str) -> None:
    assert mask_dsn(dsn) == masked
    assert "s3cret" not in mask_dsn(dsn)
