"""Each part registers its own commands under the one `trainguard` (the
`trainguard.commands` entry points, read by agent/cli.py): a function becomes a command, a
typer.Typer a group; a part that cannot load answers one line and exit 2 and leaves the
other commands working."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from tests.packaging.support import PARTS_COMMANDS, ROOT, SERVER_MODULES
from trainguard.agent.cli import COMMANDS_GROUP, add_part_commands, app

group_app = typer.Typer(no_args_is_help=True)


@group_app.command("hello")
def _hello(name: str = "you") -> None:
    typer.echo(f"hello {name}")


def single(times: int = 1) -> None:
    """A command of its own."""
    typer.echo("single " * times)


def _entry_points(**values: str) -> metadata.EntryPoints:
    return metadata.EntryPoints(
        metadata.EntryPoint(name=name, value=value, group=COMMANDS_GROUP)
        for name, value in values.items()
    )


def _root(**values: str) -> typer.Typer:
    root = typer.Typer(no_args_is_help=True, add_completion=False)

    @root.command("agent")
    def agent() -> None:
        typer.echo("the agent")

    add_part_commands(root, _entry_points(**values))
    return root


def test_a_function_is_a_command_and_a_typer_a_group() -> None:
    here = __name__
    root = _root(one=f"{here}:single", grp=f"{here}:group_app")
    runner = CliRunner()
    assert runner.invoke(root, ["one", "--times", "2"]).output == "single single \n"
    assert runner.invoke(root, ["grp", "hello", "--name", "x"]).output == "hello x\n"
    assert "A command of its own." in runner.invoke(root, ["--help"]).output


def test_the_first_command_of_a_name_wins() -> None:
    root = _root(agent=f"{__name__}:single", one=f"{__name__}:single")
    assert CliRunner().invoke(root, ["agent"]).output == "the agent\n"


def test_a_part_not_in_this_install_says_it_runs_from_a_checkout() -> None:
    root = _root(bench="trainguard.backend.nosuchpart.cli:app")
    for argv in (["bench"], ["bench", "run", "--fast"], ["bench", "--help"]):
        got = CliRunner().invoke(root, argv)
        assert got.exit_code == 2, got.output
        assert got.output == (
            "trainguard bench runs from a checkout of the repository, not from an installed "
            "wheel (no trainguard.backend.nosuchpart here): `pip install -e .` in the checkout\n"
        )
    assert CliRunner().invoke(root, ["agent"]).output == "the agent\n"


def test_a_part_that_cannot_load_answers_one_line_and_the_others_still_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "tg_part_needs_dep.py").write_text("import tg_no_such_dependency\n")
    (tmp_path / "tg_part_raises.py").write_text("raise RuntimeError('bad part')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    root = _root(dep="tg_part_needs_dep:app", bad="tg_part_raises:app", missing=f"{__name__}:nope")
    runner = CliRunner()
    expected = {
        "dep": "trainguard dep cannot load: No module named 'tg_no_such_dependency'\n",
        "bad": "trainguard bad cannot load: RuntimeError: bad part\n",
        "missing": "trainguard missing cannot load: AttributeError: ",
    }
    for name, line in expected.items():
        got = runner.invoke(root, [name])
        assert got.exit_code == 2 and got.output.startswith(line), got.output
        assert got.output.count("\n") == 1 and "Traceback" not in got.output
    assert runner.invoke(root, ["agent"]).output == "the agent\n"


def test_the_installed_cli_has_every_parts_commands_and_each_loads() -> None:
    eps = metadata.entry_points(group=COMMANDS_GROUP)
    assert {ep.name for ep in eps} == {*PARTS_COMMANDS}
    command = typer.main.get_command(app)
    assert set(command.commands) == {"agent", *(ep.name for ep in eps)}  # type: ignore[attr-defined]  # a typer app is a click Group
    runner = CliRunner()
    for name in command.commands:  # type: ignore[attr-defined]  # a typer app is a click Group
        got = runner.invoke(app, [name, "--help"])
        assert got.exit_code == 0 and "Usage:" in got.output, (name, got.output)
        assert "not available" not in got.output and "cannot load" not in got.output


def test_the_root_names_no_backend_module_and_imports_no_server_dependency() -> None:
    assert "trainguard.backend" not in (ROOT / "agent" / "cli.py").read_text()
    probe = (
        "import sys, trainguard.agent.cli; "
        "print(*sorted({m.split('.')[0] for m in sys.modules} & set(sys.argv[1:])))"
    )
    got = subprocess.run(
        [sys.executable, "-c", probe, *SERVER_MODULES, "pydantic"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert got.stdout.strip() == ""
