"""What the installed distribution says about itself, and the files it must carry."""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import replicron

REPO = Path(__file__).resolve().parents[2]


def test_metadata_license_and_classifiers() -> None:
    metadata = importlib.metadata.metadata("replicron")
    assert metadata["License-Expression"] == "MIT"  # SPDX, not the deprecated table form
    assert metadata.get_all("License-File") == ["LICENSE"]
    classifiers = metadata.get_all("Classifier") or []
    assert "Typing :: Typed" in classifiers
    assert "Programming Language :: Python :: 3.11" in classifiers
    assert metadata["Requires-Python"] == ">=3.11"
    assert metadata["Version"] == replicron.__version__


def test_the_wheel_carries_every_sql_file_the_license_and_the_type_marker(tmp_path: Path) -> None:
    tree = tmp_path / "tree"  # a copy: building writes build/ and egg-info beside the sources
    shutil.copytree(REPO / "src", tree / "src", ignore=shutil.ignore_patterns("*.egg-info"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, tree / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(tree), "--no-deps", "-q", "-w", str(tmp_path)],
        check=True,
        timeout=300,
    )
    [wheel] = tmp_path.glob("replicron-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = {str(p.relative_to(REPO / "src")) for p in (REPO / "src").rglob("*.sql")}
    assert len(sources) >= 6
    assert sources <= names
    assert "replicron/py.typed" in names
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)
