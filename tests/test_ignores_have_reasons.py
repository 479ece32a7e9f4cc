"""Every ignore keeps its reason (issue #15): a `# type: ignore[...]` or `# noqa: ...`
comment says after it why the tool is wrong there or why the pattern is intended, as
`# type: ignore[code]  # <reason>` or `# noqa: CODE - <reason>`.

Landed migrations (migrations/versions) are never edited, so they are not scanned.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("agent", "backend", "migrations", "examples", "tests")
SKIPPED = ({".venv", "build", "__pycache__", "node_modules"}, REPO / "migrations" / "versions")

# The pragma and what follows it in the same comment; the rest must say something.
PRAGMA = re.compile(
    r"#\s*(?:type:\s*ignore(?:\[[^\]]*\])?|(?:ruff:\s*)?noqa(?::\s*[A-Z]+[0-9]*(?:\s*,\s*[A-Z]+[0-9]*)*)?)"
    r"(?P<rest>.*)$"
)


def missing_reasons(source: str) -> list[tuple[int, str]]:
    """(line, comment) of each ignore comment in `source` with no reason after it."""
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT:
            continue
        m = PRAGMA.search(tok.string)
        if m and not re.search(r"[A-Za-z]", m.group("rest")):
            found.append((tok.start[0], tok.string))
    return found


def scanned_files() -> list[Path]:
    names, versions = SKIPPED
    files = []
    for folder in FOLDERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            rel = path.relative_to(REPO)
            if names.intersection(rel.parts) or versions in path.parents:
                continue
            files.append(path)
    return files


def test_every_ignore_comment_gives_its_reason() -> None:
    files = scanned_files()
    assert len(files) > 100 and REPO / "agent" / "cli.py" in files
    bare = [
        f"{path.relative_to(REPO)}:{line}: {comment}"
        for path in files
        for line, comment in missing_reasons(path.read_text())
    ]
    assert not bare, "ignores without a reason after them:\n" + "\n".join(bare)


def test_a_bare_ignore_is_found_and_a_reasoned_one_is_not() -> None:
    planted = (
        "x = f()  # type: ignore[arg-type]\n"
        "y = g()  # type: ignore\n"
        "import a  # noqa: F401\n"
        "import b  # noqa\n"
        "z = h()  # type: ignore[union-attr]  # set when workdir is not\n"
        "import c  # noqa: F401, E402 - imported to check it is installed\n"
        "w = k()  # a comment that names no pragma\n"
        "s = '# type: ignore[misc] in a string is no comment'\n"
    )
    assert [line for line, _ in missing_reasons(planted)] == [1, 2, 3, 4]
