"""Django stays inside ``replicron.contrib.django``: nothing else imports it, so the core
installs and imports without it; and the app's modules that need a configured project
declare their public names like every other module."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import replicron
from tests.django.project import PROJECT
from tests.helpers import REPO

ROOT = Path(replicron.__file__).parent
APP = ROOT / "contrib" / "django"


def test_only_the_django_app_imports_django() -> None:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if APP in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            found += [
                f"{path.relative_to(ROOT)}: {n}"
                for n in names
                if n.split(".")[0] in ("django", "asgiref")
            ]
    assert found == []


def test_the_apps_modules_declare_their_names_in_a_configured_project() -> None:
    code = (
        "import django, importlib, json, pkgutil; django.setup(); "
        "import replicron.contrib.django as app; "
        "names = [app.__name__] + [i.name for i in pkgutil.walk_packages(app.__path__, "
        "app.__name__ + '.')]; "
        "mods = {n: importlib.import_module(n) for n in names}; "
        "print(json.dumps({n: [x for x in getattr(m, '__all__', ['<no __all__>']) "
        "if x != '<no __all__>' and not hasattr(m, x)] if hasattr(m, '__all__') "
        "else ['<no __all__>'] for n, m in mods.items()}))"
    )
    env = {"DJANGO_SETTINGS_MODULE": "mysite.settings", "PYTHONPATH": f"{PROJECT}:{REPO}"}
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert len(found) >= 10
    assert {module: missing for module, missing in found.items() if missing} == {}
    assert [m for m in found if m.endswith(".0001_initial")] == [
        "replicron.contrib.django.migrations.0001_initial"
    ]
