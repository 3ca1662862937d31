"""The configs that ship in examples/ (and the one inside the Kubernetes example) are valid:
the docs point people at them."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from replicron.daemon import check_config
from tests.helpers import REPO

EXAMPLES = REPO / "examples"


@pytest.fixture(autouse=True)
def _database_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://app:secret@db.example/jobs")
    for name in ("REPLICRON_STATE_DIR", "REPLICRON_DATABASE_URL", "REPLICRON_HTTP"):
        monkeypatch.delenv(name, raising=False)


def _checked(path: Path) -> str:
    out = io.StringIO()
    assert check_config(str(path), out=out) == 0, out.getvalue()
    return out.getvalue()


@pytest.mark.parametrize("name", ["jobs.toml", "postgres.toml"])
def test_an_example_config_is_valid(name: str) -> None:
    assert _checked(EXAMPLES / name).endswith("is valid\n")


def test_the_config_in_the_kubernetes_example_is_valid(tmp_path: Path) -> None:
    manifest = (EXAMPLES / "kubernetes.yaml").read_text()
    found = re.search(r"^  jobs\.toml: \|\n((?:    .*\n|\n)+)", manifest, re.M)
    assert found is not None
    config = tmp_path / "jobs.toml"
    config.write_text("".join(line[4:] + "\n" for line in found.group(1).splitlines()))
    output = _checked(config)
    assert "on PostgreSQL (namespace 'prod/', advisory coordination)" in output
    assert "secret" not in output
