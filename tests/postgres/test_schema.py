"""sql/schema.sql, the whole schema in one file, is what the migrations make; and the ledger's
``outcome`` check lists exactly the values of :class:`replicron.events.Outcome`.

Schemas are compared through the catalog (tables and their columns in order, types,
defaults, constraints, indexes, sequences, and whatever else a schema file could add), so
the comparison needs no pg_dump of the server's version.
"""

from __future__ import annotations

import asyncio
import re
from importlib import resources
from typing import Any

import psycopg

from replicron.events import Outcome
from replicron.postgres import migrate
from replicron.postgres._sql import migrations
from tests.helpers import fresh_database

#: What makes up the schema, each as rows of the catalog, in a stable order.
CATALOG = {
    "relations": """
        SELECT c.relname, c.relkind, c.relpersistence, c.reloptions
        FROM pg_class c
        WHERE c.relnamespace = current_schema()::regnamespace
        ORDER BY 1""",
    "columns": """
        SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               pg_get_expr(d.adbin, d.adrelid), a.attidentity, a.attgenerated, a.attcollation
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE c.relnamespace = current_schema()::regnamespace
          AND c.relkind IN ('r', 'p', 'v', 'm', 'f') AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY c.relname, a.attnum""",
    "constraints": """
        SELECT conrelid::regclass::text, conname, contype, pg_get_constraintdef(oid)
        FROM pg_constraint
        WHERE connamespace = current_schema()::regnamespace
        ORDER BY 1, 2""",
    "indexes": """
        SELECT tablename, indexname, indexdef FROM pg_indexes
        WHERE schemaname = current_schema()
        ORDER BY 1, 2""",
    "sequences": """
        SELECT sequencename, data_type::text, start_value, min_value, max_value, increment_by,
               cycle, cache_size
        FROM pg_sequences
        WHERE schemaname = current_schema()
        ORDER BY 1""",
    "sequence owners": """
        SELECT s.relname, t.relname, a.attname
        FROM pg_depend d
        JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S'
        JOIN pg_class t ON t.oid = d.refobjid
        JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
        WHERE d.classid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')
          AND s.relnamespace = current_schema()::regnamespace
        ORDER BY 1""",
    "views": """
        SELECT viewname, definition FROM pg_views WHERE schemaname = current_schema()
        ORDER BY 1""",
    "types": """
        SELECT t.typname, t.typtype, format_type(t.typbasetype, t.typtypmod),
               ARRAY(SELECT enumlabel::text FROM pg_enum
                     WHERE enumtypid = t.oid ORDER BY enumsortorder)
        FROM pg_type t
        WHERE t.typnamespace = current_schema()::regnamespace
          AND t.typtype IN ('d', 'e', 'r', 'm')
        ORDER BY 1""",
    "functions": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid), p.prokind, p.prosrc
        FROM pg_proc p
        WHERE p.pronamespace = current_schema()::regnamespace
        ORDER BY 1, 2""",
    "triggers": """
        SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(oid)
        FROM pg_trigger
        WHERE NOT tgisinternal
          AND tgrelid IN (SELECT oid FROM pg_class
                          WHERE relnamespace = current_schema()::regnamespace)
        ORDER BY 1, 2""",
    "comments": """
        SELECT c.relname, d.objsubid, d.description
        FROM pg_description d
        JOIN pg_class c ON c.oid = d.objoid AND d.classoid = 'pg_class'::regclass
        WHERE c.relnamespace = current_schema()::regnamespace
        ORDER BY 1, 2""",
}

RECORDED = [(m.version, m.name) for m in migrations()]


def schema_sql() -> str:
    """sql/schema.sql as the installed package ships it."""
    return resources.files("replicron.postgres").joinpath("sql/schema.sql").read_text("utf-8")


def rows(dsn: str, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as conn:
        cursor = conn.execute(query.encode())
        return cursor.fetchall() if cursor.description else []


def catalog(dsn: str) -> dict[str, list[tuple[Any, ...]]]:
    return {part: rows(dsn, query) for part, query in CATALOG.items()}


def test_schema_sql_makes_what_the_migrations_make() -> None:
    with fresh_database() as from_file, fresh_database() as migrated:
        rows(from_file, schema_sql())
        assert asyncio.run(migrate(migrated)) == [f"{v:04d}_{name}" for v, name in RECORDED]

        expected = catalog(migrated)
        assert [name for name, *_ in expected["relations"]] == [
            "replicron_job_locks",
            "replicron_job_locks_pkey",
            "replicron_jobs",
            "replicron_jobs_pkey",
            "replicron_leaders",
            "replicron_leaders_pkey",
            "replicron_migrations",
            "replicron_migrations_pkey",
            "replicron_paused",
            "replicron_paused_pkey",
            "replicron_pruned_runs",
            "replicron_pruned_runs_pkey",
            "replicron_replicas",
            "replicron_replicas_pkey",
            "replicron_run_requests",
            "replicron_run_requests_namespace_idx",
            "replicron_run_requests_pkey",
            "replicron_run_requests_request_id_seq",
            "replicron_runs",
            "replicron_runs_claimed_at_idx",
            "replicron_runs_missed_idx",
            "replicron_runs_open_idx",
            "replicron_runs_pkey",
            "replicron_runs_ranges_idx",
            "replicron_runs_run_id_seq",
            "replicron_runs_tick_key",
        ]  # the catalog queries see the schema at all
        found = catalog(from_file)
        for part in CATALOG:
            assert found[part] == expected[part], f"schema.sql differs in its {part}"

        # The file records the migrations as applied: replicron finds nothing to do there.
        recorded = "SELECT version, name FROM replicron_migrations ORDER BY 1"
        assert rows(from_file, recorded) == rows(migrated, recorded) == RECORDED
        assert asyncio.run(migrate(from_file)) == []
        assert catalog(from_file) == found


def test_outcome_check_lists_every_outcome(dsn: str) -> None:
    asyncio.run(migrate(dsn))
    [(definition,)] = rows(
        dsn,
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE conrelid = 'replicron_runs'::regclass AND contype = 'c'",
    )
    # CHECK ((outcome = ANY (ARRAY['succeeded'::text, 'failed'::text, ...])))
    assert re.fullmatch(r"CHECK \(\(outcome = ANY \(ARRAY\[.*\]\)\)\)", definition), definition
    values = re.findall(r"'([^']*)'::text", definition)
    assert len(values) == len(set(values)), definition
    assert sorted(values) == sorted(outcome.value for outcome in Outcome)
