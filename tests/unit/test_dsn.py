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
        ("postgresql://u:ab#cd@h/db", "postgresql://u:***@h/db"),
        ("postgresql+psycopg://postgres:ab#cd@db:5432/x", "postgresql+psycopg://postgres:***@db:5432/x"),
        ("postgresql://u:p@ss@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u:a?b@h", "postgresql://u:***@h"),
        ("postgresql://:only@h/db", "postgresql://:***@h/db"),
        ("postgresql://u:x%23y@h/db?sslmode=require", "postgresql://u:***@h/db?sslmode=require"),
        ("postgresql://u@h/db?password=s3cret", "postgresql://u@h/db?password=***"),
        (
            "two: postgresql://a:s3cret@h/x and postgresql://b:s3cret@h/y",
            "two: postgresql://a:***@h/x and postgresql://b:***@h/y",
        ),
        ("postgresql://h:5432/db", "postgresql://h:5432/db"),
    ],
)  # fmt: skip
def test_mask_dsn(dsn: str, masked: str) -> None:
    assert mask_dsn(dsn) == masked
    assert "s3cret" not in mask_dsn(dsn)


@pytest.mark.parametrize(
    ("dsn", "plain"),
    [
        ("postgresql+psycopg://u:p@h/db", "postgresql://u:p@h/db"),
        ("postgresql+psycopg2://u@h/db", "postgresql://u@h/db"),
        ("postgres+asyncpg://h/db", "postgres://h/db"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
        ("host=h dbname=x", "host=h dbname=x"),
        ("  postgresql+psycopg://h/db  ", "postgresql://h/db"),
    ],
)
def test_sqlalchemy_urls_become_libpq_urls(dsn: str, plain: str) -> None:
    from replicron._dsn import plain_postgres_url

    assert plain_postgres_url(dsn) == plain
