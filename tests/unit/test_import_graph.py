"""The package's modules import one another by the rules of docs/architecture.md, even for
type checking only: the layers stay layers, without a cycle, private modules stay private to
their package, and the engine is reached through the scheduler's public API."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import replicron

ROOT = Path(replicron.__file__).parent
ARCHITECTURE = ROOT.parents[1] / "docs" / "architecture.md"


def _module_name(path: Path) -> str:
    parts = ["replicron", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The package modules ``path`` imports, for running or for type checking alike."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {module for module in found if module in modules and module != name}


def _graph() -> dict[str, set[str]]:
    paths = {_module_name(path): path for path in ROOT.rglob("*.py")}
    modules = set(paths)
    return {name: _imports(path, modules) for name, path in paths.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for child in sorted(graph[node]):
            if state.get(child) == 1:
                return [*path[path.index(child) :], child]
            if child not in state and (found := visit(child)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_the_graph_sees_the_imports() -> None:
    graph = _graph()
    assert "replicron._engine.registry" in graph["replicron._engine.engine"]
    assert "replicron._engine.spec" in graph["replicron.jobs"]


def test_no_module_imports_itself_through_others() -> None:
    # Package __init__ modules re-export their children; an edge from a child back to its
    # own package's __init__ is the only kind allowed to close a loop.
    graph = {
        name: {m for m in deps if not name.startswith(m + ".")} for name, deps in _graph().items()
    }
    assert _cycle(graph) is None


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


# ---- layers ----------------------------------------------------------------------------


def _layers() -> dict[str, int]:
    """Each top-level module or package's layer, as docs/architecture.md's ``layers`` block
    states them (``__init__`` is the package itself)."""
    block = re.search(r"```layers\n(.*?)```", ARCHITECTURE.read_text(), re.S)
    assert block is not None, "docs/architecture.md has no ```layers block"
    found: dict[str, int] = {}
    for line in block[1].splitlines():
        number, _, names = line.partition(":")
        for name in names.split():
            assert name not in found, f"{name} is in two layers"
            found[name] = int(number.split()[0])
    return found


def _top(module: str) -> str:
    """The top-level module or package ``module`` belongs to."""
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def _against_the_layers(graph: dict[str, set[str]], layers: dict[str, int]) -> list[str]:
    wrong = []
    for module, imports in sorted(graph.items()):
        for imported in sorted(imports):
            if layers[_top(imported)] > layers[_top(module)]:
                wrong.append(f"{module} (layer {layers[_top(module)]}) imports {imported}")
    return wrong


def test_every_module_has_a_layer() -> None:
    layers = _layers()
    assert sorted({_top(m) for m in _graph()} - set(layers)) == []
    assert sorted(set(layers) - {_top(m) for m in _graph()}) == []


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    assert _against_the_layers(_graph(), _layers()) == []


def test_the_layer_check_finds_an_import_from_above() -> None:
    graph = {"replicron.backends.memory": {"replicron._engine.engine"}}
    assert _against_the_layers(graph, {"backends": 3, "_engine": 4}) == [
        "replicron.backends.memory (layer 3) imports replicron._engine.engine"
    ]


# ---- private modules -------------------------------------------------------------------


def _private_owner(module: str) -> str | None:
    """The package a private module is private to (``replicron.postgres`` for
    ``replicron.postgres._sources``), or None for a public module."""
    parts = module.split(".")
    for at, part in enumerate(parts):
        if part.startswith("_") and part not in ("__init__", "__main__"):
            return ".".join(parts[:at])
    return None


def _may_import(module: str, imported: str, packages: set[str]) -> bool:
    """Whether ``module`` may import ``imported``: a private module only from its own
    package, or from the private parts of that package (``replicron._engine.x`` may import
    ``replicron._schedule.tz``; ``replicron.daemon.x``, in a public package of its own, may
    not)."""
    owner = _private_owner(imported)
    if owner is None or module == owner:
        return True
    if not module.startswith(owner + "."):
        return False
    below = module[len(owner) + 1 :].split(".")
    if below[0].startswith("_"):
        return True
    return len(below) == 1 and f"{owner}.{below[0]}" not in packages


def _packages() -> set[str]:
    return {_module_name(path) for path in ROOT.rglob("__init__.py")}


def _private_imports(graph: dict[str, set[str]]) -> list[str]:
    packages = _packages()
    return [
        f"{module} imports {imported}"
        for module, imports in sorted(graph.items())
        for imported in sorted(imports)
        if not _may_import(module, imported, packages)
    ]


def test_no_module_imports_another_packages_private_module() -> None:
    assert _private_imports(_graph()) == []


def test_the_private_check_tells_own_from_other_packages() -> None:
    packages = {"replicron", "replicron.postgres", "replicron._engine", "replicron.daemon"}

    def may(module: str, imported: str) -> bool:
        return _may_import(module, imported, packages)

    assert may("replicron.postgres.backend", "replicron.postgres._session")
    assert may("replicron.postgres._cluster", "replicron.postgres._session")
    assert may("replicron.scheduler", "replicron._engine.engine")
    assert may("replicron._engine.registry", "replicron._schedule.tz")
    assert may("replicron.daemon.command", "replicron.context")
    assert not may("replicron.daemon._daemon", "replicron.postgres._sources")
    assert not may("replicron.daemon.command", "replicron._schedule.tz")
    assert not may("replicron.postgres.backend", "replicron._schedule.tz")
    assert not may("replicron.postgres._sql", "replicron.backends._ledger")


# ---- the engine and attributes by name -------------------------------------------------

#: The modules that hold a scheduler's engine: everything else uses their public API.
ENGINE_HOLDERS = {"replicron.scheduler", "replicron.jobs"}


def _reaches(text: str, module: str) -> list[str]:
    """``x._engine`` outside the engine's holders, and ``getattr``/``hasattr`` of an attribute
    named by a string (other than a dunder), in ``module``'s source ``text``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(text)):
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "_engine"
            and module not in ENGINE_HOLDERS
        ):
            found.append((node.lineno, f"{module}:{node.lineno} reaches ._engine"))
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and not node.args[1].value.startswith("__")
        ):
            name = node.args[1].value
            found.append((node.lineno, f"{module}:{node.lineno} {node.func.id}(..., {name!r})"))
    return [line for _, line in sorted(found)]


def test_the_engine_is_reached_through_public_api_and_attributes_by_their_names() -> None:
    found = [
        line
        for path in sorted(ROOT.rglob("*.py"))
        for line in _reaches(path.read_text(), _module_name(path))
    ]
    assert found == []


def test_the_reach_check_finds_a_reach() -> None:
    text = "def f(s):\n    s._engine.stop_waiting()\n    return getattr(s, 'peers', None)\n"
    assert _reaches(text, "replicron.daemon._example") == [
        "replicron.daemon._example:2 reaches ._engine",
        "replicron.daemon._example:3 getattr(..., 'peers')",
    ]
    assert _reaches(text.replace("'peers'", "'__name__'"), "replicron.scheduler") == []


#: CONTRIBUTING.md: an alarm, not a budget. Modules are split by meaning; one that grows past
#: this is looked at for the several ideas it may have come to hold.
MAX_MODULE_LINES = 1000


def test_no_module_is_past_the_size_alarm() -> None:
    sizes = {
        str(path.relative_to(ROOT)): len(path.read_text().splitlines())
        for path in ROOT.rglob("*.py")
    }
    assert len(sizes) > 50  # the whole package was read
    assert {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES} == {}
