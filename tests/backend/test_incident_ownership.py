"""backend/incidents owns every incident transition: no other module of the backend sets
an incident's status, level, outcome or timeline, or makes Incident, IncidentEvidence or
Command rows (the engine, the command channel and the jobs routes call
incidents.service). Read from the source, so a path no test exercises counts too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

BACKEND = Path(__file__).resolve().parents[2] / "backend"
OWNER = BACKEND / "incidents"
MODELS = {"trainguard.backend.models", "trainguard.backend.models.control"}
# The rows only the incidents service makes.
ROWS = {"Incident", "IncidentEvidence", "Command"}
# What an incident's transitions change: its status and where it stands, its timeline,
# its decisions, hooks and escalations.
FIELDS = {
    "status",
    "level",
    "outcome",
    "not_before",
    "acted_at",
    "closed_at",
    "escalations",
    "decisions",
    "hooks",
    "lost_steps",
    "decided_at",
    "delivered_at",
    "torn_down_at",
    "restarted_at",
    "resumed_at",
}
# Stores of those names that are not an incident's: (file, target).
NOT_INCIDENTS = {
    ("commands/service.py", "cmd.delivered_at"),  # the command's own first delivery
    # the GPU check's table rows (a dataclass of the bench, read from the API)
    ("bench/gpucheck.py", "row.level"),
    ("bench/gpucheck.py", "row.status"),
}


def _row_names(tree: ast.Module) -> tuple[set[str], set[str]]:
    """The names this module binds to the guarded ORM classes, and to the models modules."""
    classes: set[str] = set()
    modules: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.module is None:
            continue
        for alias in node.names:
            if node.module in MODELS and alias.name in ROWS:
                classes.add(alias.asname or alias.name)
            elif f"{node.module}.{alias.name}" in MODELS:
                modules.add(alias.asname or alias.name)
    return classes, modules


def _is_row(expr: ast.expr, classes: set[str], modules: set[str]) -> bool:
    if isinstance(expr, ast.Name):
        return expr.id in classes
    return (
        isinstance(expr, ast.Attribute)
        and expr.attr in ROWS
        and isinstance(expr.value, ast.Name)
        and expr.value.id in modules
    )


def violations(path: Path, source: str) -> list[str]:
    """Where a module outside backend/incidents changes an incident or makes a row."""
    tree = ast.parse(source)
    rel = path.relative_to(BACKEND).as_posix()
    classes, modules = _row_names(tree)
    out: list[str] = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            for sub in ast.walk(target):
                if (
                    isinstance(sub, ast.Attribute)
                    and sub.attr in FIELDS
                    and (rel, ast.unparse(sub)) not in NOT_INCIDENTS
                ):
                    out.append(f"{rel}:{node.lineno}: sets {ast.unparse(sub)}")
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if _is_row(func, classes, modules):
            out.append(f"{rel}:{node.lineno}: makes a {ast.unparse(func)} row")
        elif isinstance(func, ast.Name) and func.id in ("insert", "update") and node.args:
            if _is_row(node.args[0], classes, modules):
                out.append(f"{rel}:{node.lineno}: {func.id}({ast.unparse(node.args[0])})")
        elif (
            isinstance(func, ast.Name)
            and func.id == "setattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in FIELDS
        ):
            out.append(f"{rel}:{node.lineno}: setattr(..., {node.args[1].value!r})")
    return out


def _outside_owner() -> list[Path]:
    return sorted(p for p in BACKEND.rglob("*.py") if OWNER not in p.parents)


def test_only_the_incidents_service_changes_incidents_or_makes_commands() -> None:
    found = [v for p in _outside_owner() for v in violations(p, p.read_text())]
    assert found == [], "call trainguard.backend.incidents.service instead:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("inc.status = 'resolved'", "sets inc.status"),
        ("inc.torn_down_at = inc.resumed_at = None", "sets inc.torn_down_at"),
        ("inc.escalations += 1", "sets inc.escalations"),
        ("setattr(inc, 'resumed_at', 1.0)", "setattr(..., 'resumed_at')"),
        (
            "from trainguard.backend.models import Command as Row\nsession.add(Row(id='x'))",
            "makes a Row row",
        ),
        (
            "from trainguard.backend import models\nmodels.Incident(job_id=1)",
            "makes a models.Incident row",
        ),
        (
            "from trainguard.backend.models.control import IncidentEvidence\n"
            "session.execute(insert(IncidentEvidence))",
            "insert(IncidentEvidence)",
        ),
    ],
)
def test_the_check_finds_each_kind_of_change(source: str, expected: str) -> None:
    found = violations(BACKEND / "engine" / "planted.py", source)
    assert any(expected in v for v in found), found


def test_the_check_leaves_other_classes_and_reads_alone() -> None:
    source = (
        "from collections import namedtuple\n"
        "Command = namedtuple('Command', 'id')\n"  # a benchmark's own record, not the row
        "Command(1)\n"
        "job.state = 'running'\n"
        "print(inc.status, inc.resumed_at)\n"
    )
    assert violations(BACKEND / "bench" / "planted.py", source) == []
