"""Generate the sync flavour of replicron's async-first modules, or check it is current.

    python tools/async_to_sync.py          # write the generated files
    python tools/async_to_sync.py --check  # exit 1 if a generated file is stale

Rules, line by line: a line ending in ``# async-only`` is dropped, and so is every line from
one starting ``# async-only: from here`` to one starting ``# async-only: to here`` (what the
sync flavour imports from the async one, so that both share one definition); a line ending in
``# sync: TEXT`` becomes TEXT (keeping its indentation); then words are renamed
(``async def`` -> ``def``, ``await `` -> ``""``, ``AsyncConnection`` -> ``Connection`` ...).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAIRS = [
    (
        ROOT / "src/replicron/postgres/_locked_async.py",
        ROOT / "src/replicron/postgres/_locked_sync.py",
    ),
]
RENAMES = [
    (r"\basync def\b", "def"),
    (r"\basync with\b", "with"),
    (r"\bawait ", ""),
    (r"\bAsyncIterator\b", "Iterator"),
    (r"\basynccontextmanager\b", "contextmanager"),
    (r"\bAsyncConnectionPool\b", "ConnectionPool"),
    (r"\bAsyncConnection\b", "Connection"),
    (r"\balocked_run\b", "locked_run"),
    (
        r"from collections.abc import Iterator, Callable",
        "from collections.abc import Callable, Iterator",
    ),
    (r"async flavour \(source of the sync one\)", "sync flavour"),
]
HEADER = '"""Generated from {source} by tools/async_to_sync.py: do not edit."""\n'


def convert(text: str, source: str) -> str:
    lines = []
    dropping = False
    for line in text.splitlines():
        if line.lstrip().startswith("# async-only: from here"):
            dropping = True
        if dropping:
            dropping = not line.lstrip().startswith("# async-only: to here")
            continue
        if line.rstrip().endswith("# async-only"):
            continue
        match = re.match(r"^(\s*).*# sync: (.*)$", line)
        if match:
            line = match[1] + match[2]
        for pattern, replacement in RENAMES:
            line = re.sub(pattern, replacement, line)
        lines.append(line)
    body = re.sub(r"\n{4,}", "\n\n\n", "\n".join(lines) + "\n")
    # Replace the module docstring with the generated-file notice.
    return re.sub(r'\A""".*?"""\n', HEADER.format(source=source), body, count=1, flags=re.S)


def main() -> int:
    check = "--check" in sys.argv[1:]
    stale = []
    for source, target in PAIRS:
        generated = convert(source.read_text(), source.name)
        if check:
            if not target.exists() or target.read_text() != generated:
                stale.append(target)
        else:
            target.write_text(generated)
    for target in stale:
        print(f"{target.relative_to(ROOT)} is stale: run python tools/async_to_sync.py")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
