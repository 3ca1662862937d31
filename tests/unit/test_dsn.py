"""Passwords never appear in what replicron prints."""

from __future__ import annotations

import pytest

from replicron.dsn import mask_dsn, mask_secrets


@pytest.mark.parametrize(
    ("dsn", "masked"),
    [
        ("postgresql://app:s3cret@db:5432/jobs", "postgresql://app:***@db:5432/jobs"),
        (
            "postgres://app:p%40ss@db/jobs?sslmode=require",
            "postgres://app:***@db/jobs?sslmode=require",
        ),
        ("postgresql://app@db/jobs", "postgresql://app@db/jobs"),
        ("host=db user=app password=s3cret dbname=x", "host=db user=app password=*** dbname=x"),
        ("host=db password = 'with space' dbname=jobs", "host=db password = *** dbname=jobs"),
        ("error at postgresql://u:pw@h/d: refused", "error at postgresql://u:***@h/d: refused"),
        ("postgresql://u:ab#cd@h/db", "postgresql://u:***@h/db"),
        (
            "postgresql+psycopg://postgres:ab#cd@db:5432/x",
            "postgresql+psycopg://postgres:***@db:5432/x",
        ),
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
)
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
    from replicron.dsn import plain_postgres_url

    assert plain_postgres_url(dsn) == plain


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        (
            "RuntimeError: POSTGRES_PASSWORD=hunter2 rejected",
            "RuntimeError: POSTGRES_PASSWORD=*** rejected",
        ),
        ("bad env: DB_PASSWORD=hunter2", "bad env: DB_PASSWORD=***"),
        ("MYSQL_PWD=hunter2", "MYSQL_PWD=***"),
        ("PGPASSWORD=hunter2 psql", "PGPASSWORD=*** psql"),
        ("config db_password: hunter2 invalid", "config db_password: *** invalid"),
        (
            "settings {'user': 'x', 'password': 'hun ter2'}",
            "settings {'user': 'x', 'password': ***}",
        ),
        ("settings {'password': b'hunter2'}", "settings {'password': ***}"),
        ('{"password": "hunter2"}', '{"password": ***}'),
        ("passwd=hunter2; host=x", "passwd=***; host=x"),
        ("passphrase='hunter 2'", "passphrase=***"),
        ("cannot reach postgresql://etl:hunter2@dw/x", "cannot reach postgresql://etl:***@dw/x"),
        ("password reset failed for bob", "password reset failed for bob"),
    ],
)
def test_mask_secrets_in_free_text(text: str, masked: str) -> None:
    assert mask_secrets(text) == masked


def test_a_ruby_style_password_is_never_shown() -> None:
    assert "hunter2" not in mask_secrets("password => 'hunter2'")
