"""One writer per table, read from the backend's source (so a path no test exercises
counts too):

- the incidents package owns every incident transition: no other module sets an
  incident's status, level, outcome or timeline, or makes Incident, IncidentEvidence,
  Command or CommandAck rows (the engine, the command channel and the operator's routes
  call it);
- jobs/service.py alone sets a job's state, its reason, since and end (`set_job_state`);
- backend/audit.py alone makes AuditLog rows (`audit.record`).

Which package may import which is pyproject.toml's import contracts (`make lint`); this
checks what they cannot say: who writes."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

BACKEND = Path(__file__).resolve().parents[2] / "backend"
MODELS = {"trainguard.backend.models", "trainguard.backend.models.control"}


@dataclass(frozen=True)
class Owner:
    where: str  # a folder or a file under backend/
    rows: frozenset[str]  # the ORM classes only it makes
    fields: frozenset[str]  # the attributes only it sets
    call: str  # what others call instead

    def owns(self, rel: str) -> bool:
        return rel == self.where or rel.startswith(f"{self.where}/")


OWNERS = (
    Owner(
        "incidents",
        frozenset({"Incident", "IncidentEvidence", "Command", "CommandAck"}),
        # what an incident's transitions change: where it stands, its timeline, its
        # decisions, hooks and escalations
        frozenset(
            {
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
        ),
        "trainguard.backend.incidents (service, acks, operators)",
    ),
    Owner(
        "jobs/service.py",
        frozenset(),
        frozenset({"state", "state_reason", "state_since", "ended_at"}),
        "jobs.service.set_job_state",
    ),
    Owner("audit.py", frozenset({"AuditLog"}), frozenset(), "audit.record"),
)
ROWS = frozenset().union(*(o.rows for o in OWNERS))
# Stores of those names that are not the owned tables': (file, target).
NOT_OWNED = {
    # the GPU check's table rows (a dataclass of the bench, read from the API)
    ("bench/gpucheck.py", "row.level"),
    ("bench/gpucheck.py", "row.status"),
    ("bench/retention.py", "self.state"),  # the bench's own counters
    ("bench/chaos_procs.py", "run.ended_at"),  # the bench's record of a training run
}


def _owner_of_field(attr: str) -> Owner | None:
    return next((o for o in OWNERS if attr in o.fields), None)


def _owner_of_row(name: str) -> Owner | None:
    return next((o for o in OWNERS if name in o.rows), None)


def _row_names(tree: ast.Module) -> tuple[dict[str, str], set[str]]:
    """The names this module binds to the guarded ORM classes ({local name: class}), and
    to the models modules."""
    classes: dict[str, str] = {}
    modules: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.module is None:
            continue
        for alias in node.names:
            if node.module in MODELS and alias.name in ROWS:
                classes[alias.asname or alias.name] = alias.name
            elif f"{node.module}.{alias.name}" in MODELS:
                modules.add(alias.asname or alias.name)
    return classes, modules


def _row_name(expr: ast.expr, classes: dict[str, str], modules: set[str]) -> str | None:
    """The guarded class `expr` names (through this module's imports), if any."""
    if isinstance(expr, ast.Name):
        return classes.get(expr.id)
    if (
        isinstance(expr, ast.Attribute)
        and expr.attr in ROWS
        and isinstance(expr.value, ast.Name)
        and expr.value.id in modules
    ):
        return expr.attr
    return None


def violations(path: Path, source: str) -> list[str]:
    """Where a module writes a table it does not own."""
    tree = ast.parse(source)
    rel = path.relative_to(BACKEND).as_posix()
    classes, modules = _row_names(tree)
    out: list[str] = []

    def bad(owner: Owner | None, lineno: int, what: str) -> None:
        if owner is not None and not owner.owns(rel):
            out.append(f"{rel}:{lineno}: {what} (call {owner.call})")

    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        while targets:
            target = targets.pop()
            if isinstance(target, ast.Tuple | ast.List | ast.Starred):
                targets.extend(
                    target.elts if not isinstance(target, ast.Starred) else [target.value]
                )
            elif isinstance(target, ast.Attribute) and (rel, ast.unparse(target)) not in NOT_OWNED:
                bad(_owner_of_field(target.attr), node.lineno, f"sets {ast.unparse(target)}")
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if (row := _row_name(func, classes, modules)) is not None:
            bad(_owner_of_row(row), node.lineno, f"makes a {ast.unparse(func)} row")
        elif isinstance(func, ast.Name) and func.id in ("insert", "update") and node.args:
            if (row := _row_name(node.args[0], classes, modules)) is not None:
                bad(_owner_of_row(row), node.lineno, f"{func.id}({ast.unparse(node.args[0])})")
        elif (
            isinstance(func, ast.Name)
            and func.id == "setattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            bad(
                _owner_of_field(node.args[1].value),
                node.lineno,
                f"setattr(..., {node.args[1].value!r})",
            )
    return out


def test_each_owned_table_has_one_writer() -> None:
    found = [v for p in sorted(BACKEND.rglob("*.py")) for v in violations(p, p.read_text())]
    assert found == [], "a table written outside its owner:\n" + "\n".join(found)


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
        ("job.state = 'running'", "sets job.state (call jobs.service.set_job_state)"),
        ("j.ended_at = 1.0", "sets j.ended_at"),
        ("inc.outcome, n = 'x', 1", "sets inc.outcome"),
        (
            "from trainguard.backend.models import AuditLog\nsession.add(AuditLog(ts=1))",
            "makes a AuditLog row (call audit.record)",
        ),
        (
            "from trainguard.backend.models import CommandAck\nsession.add(CommandAck())",
            "makes a CommandAck row",
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
        "print(inc.status, inc.resumed_at, job.state)\n"
    )
    assert violations(BACKEND / "bench" / "planted.py", source) == []


def test_the_owners_write_their_own_tables() -> None:
    assert violations(BACKEND / "jobs" / "service.py", "job.state = 'running'") == []
    assert violations(BACKEND / "incidents" / "acks.py", "inc.resumed_at = 1.0") == []
    source = "from trainguard.backend.models import AuditLog\nsession.add(AuditLog(ts=1))"
    assert violations(BACKEND / "audit.py", source) == []
