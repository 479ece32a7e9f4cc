"""The import contract between the parts (../shared/DESIGN.md, "Folders"), read from the
source with `ast`: every import statement, at the top of a module or inside a function
(the CLI's lazy imports), and `importlib.import_module("...")` with a literal name.

- the agent (agent/**) never imports the backend or the migrations;
- the operator client (agent/client/**) imports nothing of trainguard but itself and the
  protocol: no backend (an operator's laptop has no server), no agent daemon;
- the SDK (agent/sdk/**) imports the standard library and trainguard.protocol only (an
  import inside `try: ... except ImportError` is optional, not a dependency: torch when
  present);
- the worker shim (agent/worker/__init__.py, __main__.py, shim.py: it runs before every
  worker a launcher starts) imports the standard library and trainguard.worker only;
- the engine (backend/engine/**) knows no HTTP: no fastapi, no starlette. Its router.py,
  the domain's REST surface like every domain's, is the exception, and no other engine
  module imports it;
- the backend (backend/**, not backend/bench, which is not shipped) imports nothing of the
  agent but trainguard.protocol;
- anywhere: no bare `agent`, `backend`, `migrations` (the installed names are
  `trainguard.*`), and the SDK, the protocol and the client under their own names, never
  as `trainguard.agent.sdk` / `trainguard.agent.protocol` / `trainguard.agent.client` (a
  second copy of the module).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[2]
# Folders that hold no source of the project (virtual environments, build output, state).
SKIPPED = {"build", "data", "artifacts", "node_modules", "__pycache__"}
# pyproject.toml's package-dir, most specific folder first.
PACKAGE_DIRS = (
    ("agent/protocol", "trainguard.protocol"),
    ("agent/sdk", "trainguard.sdk"),
    ("agent/client", "trainguard.client"),
    ("agent/worker", "trainguard.worker"),
    ("agent", "trainguard.agent"),
    ("backend", "trainguard.backend"),
    ("migrations", "trainguard.migrations"),
    ("examples", "trainguard.examples"),
)
OPTIONAL = ("ImportError", "ModuleNotFoundError")


class Import(NamedTuple):
    target: str  # the module, or module.name for `from module import name`
    line: int
    optional: bool  # inside `try:` with an `except ImportError`


class Violation(NamedTuple):
    path: str
    line: int
    target: str
    rule: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: -> {self.target} ({self.rule})"


def _under(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def module_name(rel: str) -> str:
    """The dotted name a file imports as: agent/sdk/x.py -> trainguard.sdk.x."""
    path = rel.removesuffix(".py").removesuffix("/__init__")
    for folder, package in PACKAGE_DIRS:
        if path == folder or path.startswith(folder + "/"):
            return package + path[len(folder) :].replace("/", ".")
    return path.replace("/", ".")


def imports(rel: str, source: str) -> Iterator[Import]:
    """Every import in the source, relative ones resolved against the file's package."""
    module = module_name(rel)
    package = module if rel.endswith("__init__.py") else module.rpartition(".")[0]

    def absolute(level: int, name: str | None) -> str:
        if not level:
            return name or ""
        base = package.split(".")[: len(package.split(".")) - (level - 1)]
        return ".".join([*base, *([name] if name else [])])

    def walk(node: ast.AST, optional: bool) -> Iterator[Import]:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(alias.name, node.lineno, optional)
        elif isinstance(node, ast.ImportFrom):
            base = absolute(node.level, node.module)
            for alias in node.names:
                target = base if alias.name == "*" else f"{base}.{alias.name}".lstrip(".")
                yield Import(target, node.lineno, optional)
        elif isinstance(node, ast.Call) and _is_import_module(node):
            arg = node.args[0]
            assert isinstance(arg, ast.Constant) and isinstance(arg.value, str)
            if not arg.value.startswith("."):
                yield Import(arg.value, node.lineno, optional)
        if isinstance(node, ast.Try | ast.TryStar):
            caught = {n for h in node.handlers for n in _names(h.type)}
            guarded = optional or bool(caught & set(OPTIONAL))
            for child in node.body:
                yield from walk(child, guarded)
            for child in [*node.handlers, *node.orelse, *node.finalbody]:
                yield from walk(child, optional)
            return
        for child in ast.iter_child_nodes(node):
            yield from walk(child, optional)

    yield from walk(ast.parse(source, rel), False)


def _names(node: ast.expr | None) -> list[str]:
    if isinstance(node, ast.Tuple):
        return [n for e in node.elts for n in _names(e)]
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    return []


def _is_import_module(node: ast.Call) -> bool:
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return (
        name in ("import_module", "__import__")
        and bool(node.args)
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    )


def _stdlib(name: str) -> bool:
    return name.partition(".")[0] in sys.stdlib_module_names


def rule_broken(rel: str, imp: Import) -> str | None:
    """The rule an import breaks, or None."""
    t = imp.target
    if _under(t, "agent", "backend", "migrations"):
        return "bare name: import trainguard.* instead"
    if _under(
        t,
        "trainguard.agent.sdk",
        "trainguard.agent.protocol",
        "trainguard.agent.client",
        "trainguard.agent.worker",
    ):
        return "the SDK, the protocol, the client and the worker are trainguard.sdk, ..."
    if (
        rel in ("agent/worker/__init__.py", "agent/worker/__main__.py", "agent/worker/shim.py")
        and not _stdlib(t)
        and not _under(t, "trainguard.worker")
    ):
        return "the worker shim runs before every worker: the standard library only"
    if rel.startswith("agent/client/") and (
        _under(t, "trainguard") and not _under(t, "trainguard.client", "trainguard.protocol")
    ):
        return "the client imports nothing of trainguard but trainguard.client and .protocol"
    if rel.startswith("agent/") and _under(t, "trainguard.backend", "trainguard.migrations"):
        return "the agent never imports the backend"
    if (
        rel.startswith("agent/sdk/")
        and not imp.optional
        and not _stdlib(t)
        and not _under(t, "trainguard.sdk", "trainguard.protocol")
    ):
        return "the SDK needs nothing but the standard library and trainguard.protocol"
    if (
        rel.startswith("backend/engine/")
        and rel != "backend/engine/router.py"
        and _under(t, "fastapi", "starlette", "trainguard.backend.engine.router")
    ):
        return "the engine knows no HTTP"
    if (
        rel.startswith("backend/")
        and not rel.startswith("backend/bench/")
        and _under(t, "trainguard.agent", "trainguard.sdk")
    ):
        return "the backend imports nothing of the agent but trainguard.protocol"
    return None


def check_source(rel: str, source: str) -> list[Violation]:
    found = []
    for imp in imports(rel, source):
        rule = rule_broken(rel, imp)
        if rule:
            found.append(Violation(rel, imp.line, imp.target, rule))
    return found


def python_files(root: Path) -> Iterator[Path]:
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts[:-1]
        if not any(p in SKIPPED or p.startswith(".") or p.endswith(".egg-info") for p in parts):
            yield path


def check_tree(root: Path) -> list[Violation]:
    found = []
    for path in python_files(root):
        rel = path.relative_to(root).as_posix()
        found += check_source(rel, path.read_text(encoding="utf-8"))
    return found


def test_the_parts_import_only_what_the_contract_allows() -> None:
    violations = check_tree(ROOT)
    assert not violations, f"{len(violations)} forbidden imports:\n" + "\n".join(
        map(str, violations)
    )


def test_the_scan_reads_every_part() -> None:
    rels = {p.relative_to(ROOT).as_posix() for p in python_files(ROOT)}
    for expected in (
        "agent/cli.py",
        "agent/sdk/__init__.py",
        "backend/app.py",
        "migrations/env.py",
    ):
        assert expected in rels
    assert not any(r.startswith((".venv/", "build/")) for r in rels)


def test_a_planted_violation_of_each_rule_is_caught_with_its_line() -> None:
    planted = {
        # path: (source, the targets caught)
        "agent/daemon.py": (
            "import os\n\ndef f():\n    from trainguard.backend import db\n",
            ["trainguard.backend.db"],
        ),
        "agent/metrics.py": ("from ..migrations import env\n", ["trainguard.migrations.env"]),
        "agent/sdk/__init__.py": (
            "import json\nimport httpx\nfrom trainguard.protocol import wire\n"
            "from . import _impl\ntry:\n    import torch\nexcept ImportError:\n    torch = None\n",
            ["httpx"],
        ),
        "backend/engine/policy.py": (
            "def f():\n    from fastapi import HTTPException\n"
            "from starlette.requests import Request\nfrom .router import router\n",
            [
                "fastapi.HTTPException",
                "starlette.requests.Request",
                "trainguard.backend.engine.router.router",
            ],
        ),
        "backend/engine/router.py": ("from fastapi import APIRouter\n", []),
        "backend/jobs/service.py": (
            "from trainguard.protocol import xid\nimport importlib\n"
            "m = importlib.import_module('trainguard.agent.daemon')\n"
            "from trainguard import sdk\n",
            ["trainguard.agent.daemon", "trainguard.sdk"],
        ),
        "agent/client/api.py": (
            "import httpx\nfrom trainguard.client.models import Incident\n"
            "from trainguard.protocol.wire import TIMELINE\n"
            "def f():\n    from trainguard.backend.errors import NotFound\n"
            "from ..agent import config\n",
            ["trainguard.backend.errors.NotFound", "trainguard.agent.config"],
        ),
        "backend/bench/agent.py": ("from trainguard.agent import daemon\n", []),
        "tests/test_x.py": (
            "import backend.db\nfrom agent import cli\nfrom trainguard.agent import sdk\n"
            "from trainguard.agent.protocol.wire import Batch\nfrom trainguard.backend import db\n"
            "from trainguard.agent.client import Client\n",
            [
                "backend.db",
                "agent.cli",
                "trainguard.agent.sdk",
                "trainguard.agent.protocol.wire.Batch",
                "trainguard.agent.client.Client",
            ],
        ),
    }
    for rel, (source, caught) in planted.items():
        got = check_source(rel, source)
        assert [v.target for v in got] == caught, (rel, got)
    [v] = check_source("agent/daemon.py", planted["agent/daemon.py"][0])
    assert str(v) == (
        "agent/daemon.py:4: -> trainguard.backend.db (the agent never imports the backend)"
    )
