"""The wheel as a user gets it: one `trainguard` namespace holding every source and data
file of the shipped folders (so pyproject's explicit `packages` list cannot silently miss
a new subpackage), no benchmarks; installed with the `server` extra into a fresh venv, it
migrates a database, serves the dashboard and finds the demo's training script in its
package data."""

from __future__ import annotations

import configparser
import re
import subprocess
import time
import zipfile
from email.parser import HeaderParser
from pathlib import Path
from urllib.parse import urljoin

import httpx
import pytest

from tests.packaging.support import (
    PARTS_COMMANDS,
    SERVER_MODULES,
    installed_path,
    make_venv,
    outside_env,
    run,
    serve,
    shipped_files,
)
from tests.support import AUTH, TOKEN, free_port, stop_session, wait_for

# An ES module's static and dynamic imports of other files of the UI.
_IMPORTS = re.compile(r"""(?:\bfrom\s*|\bimport\s*\(?\s*)["']((?:\.{1,2}/|/)[^"']+\.js)["']""")


def test_the_wheel_holds_one_namespace_and_no_benchmarks(wheel_names: set[str]) -> None:
    tops = {name.split("/")[0] for name in wheel_names}
    assert tops == {"trainguard", "trainguard-0.1.0.dist-info"}
    assert not [n for n in wheel_names if n.startswith("trainguard/backend/bench/")]
    # The SDK and the protocol ship once, under their own names.
    assert not [
        n
        for n in wheel_names
        if n.startswith(("trainguard/agent/sdk/", "trainguard/agent/protocol/"))
    ]
    assert "trainguard/sdk/__init__.py" in wheel_names
    assert "trainguard/protocol/wire.py" in wheel_names


def test_every_source_and_data_file_of_the_checkout_is_in_the_wheel(
    wheel_names: set[str],
) -> None:
    expected = {installed_path(rel): rel for rel in shipped_files()}
    assert len(expected) > 100
    missing = sorted(rel for path, rel in expected.items() if path not in wheel_names)
    assert not missing, "not in the wheel (pyproject.toml packages / package-data):\n" + "\n".join(
        missing
    )


def test_the_wheel_registers_the_cli_and_each_parts_commands(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        text = z.read("trainguard-0.1.0.dist-info/entry_points.txt").decode()
    eps = configparser.ConfigParser()
    eps.read_string(text)
    assert dict(eps["console_scripts"]) == {
        "trainguard": "trainguard.agent.cli:app",
        "trainguard-worker": "trainguard.worker.shim:main",  # the launchers' worker shim
    }
    assert set(eps["trainguard.commands"]) == {*PARTS_COMMANDS}


def test_the_agent_extra_brings_no_server_dependency(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        meta = HeaderParser().parsestr(z.read("trainguard-0.1.0.dist-info/METADATA").decode())
    requires = meta.get_all("Requires-Dist") or []

    def names(extra: str | None) -> set[str]:
        found = set()
        for req in requires:
            spec, _, marker = req.partition(";")
            if (extra is None) == (not marker) and (extra is None or f'"{extra}"' in marker):
                found.add(re.split(r"[\s\[<>=!~;]", spec.strip(), maxsplit=1)[0].lower())
        return found

    agent_install = names(None) | names("agent")
    assert names(None) == {"typer", "msgspec", "pydantic-settings"}
    assert {"fastapi", "sqlalchemy", "uvicorn", "alembic"} <= names("server")
    server_only = {m.replace("_", "-") for m in SERVER_MODULES} | {"psycopg", "pyyaml"}
    assert not agent_install & server_only, agent_install & server_only


def _wheel_text(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as z:
        return z.read(name).decode()


def _module_closure(url: str, entry: str) -> dict[str, httpx.Response]:
    """Every ES module the dashboard loads from `entry`, fetched like a browser would."""
    seen: dict[str, httpx.Response] = {}
    todo = [urljoin(url + "/", entry)]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen[module] = r = httpx.get(module, timeout=10)
        if r.status_code == 200:
            todo += [urljoin(module, spec) for spec in _IMPORTS.findall(r.text)]
    return seen


@pytest.mark.slow
@pytest.mark.timeout(900)  # a venv and the server's dependencies on a 2-core machine
def test_a_server_install_migrates_serves_the_dashboard_and_ships_the_demo_job(
    wheel: Path, tmp_path: Path
) -> None:
    bin_ = make_venv(tmp_path / "venv", f"{wheel}[server]")
    db_url = f"sqlite:///{tmp_path / 'trainguard.db'}"
    upgraded = run([bin_ / "trainguard", "db", "upgrade", "--database-url", db_url], tmp_path, 300)
    assert upgraded.stdout.strip() == "database at head"

    with serve(
        [bin_ / "trainguard", "server", "--database-url", db_url],
        tmp_path,
        outside_env(TRAINGUARD_ADMIN_TOKEN=TOKEN, TRAINGUARD_DATA_DIR=str(tmp_path)),
        tmp_path / "server.log",
    ) as url:
        page = httpx.get(f"{url}/", timeout=10)
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert page.text == _wheel_text(wheel, "trainguard/frontend/index.html")
        [entry] = re.findall(r'<script type="module" src="([^"]+)"', page.text)
        modules = _module_closure(url, entry)
        broken = {m: r.status_code for m, r in modules.items() if r.status_code != 200}
        assert not broken, broken
        app_js = modules[urljoin(url + "/", entry)]
        assert "javascript" in app_js.headers["content-type"]
        assert app_js.text == _wheel_text(wheel, f"trainguard/frontend/{entry}")
        assert len(modules) > 10  # the entry, its views, components and libraries
        assert httpx.get(f"{url}/api/v1/nodes", headers=AUTH, timeout=10).json() == []

    # The demo's training script, from package data (trainguard.examples), and the code
    # that runs is the installed one, not this checkout.
    where = run(
        [
            bin_ / "python",
            "-c",
            "from trainguard.backend import demo, demojob; "
            "print(demojob.TRAIN_SCRIPT); print(demo.__file__)",
        ],
        tmp_path,
        120,
    ).stdout.split()
    script, demo_module = map(Path, where)
    site = next((tmp_path / "venv" / "lib").glob("python3*/site-packages"))
    assert script == site / "trainguard" / "examples" / "train_demo.py"
    assert script.is_file() and demo_module.is_relative_to(site)

    # `trainguard demo` from that install: no train extra, so no job, and it says which
    # extra; its server and both agents keep running (agent 0 hosted the Wrapper store,
    # which needs torch, and the demo stopped a few seconds in) until SIGTERM ends them.
    port = free_port()
    out = tmp_path / "demo.out"
    demo_proc = subprocess.Popen(
        [bin_ / "trainguard", "demo", "--port", str(port), "--data-dir", tmp_path / "demo"],
        cwd=tmp_path,
        env=outside_env(),
        stdout=out.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_for(lambda: "Ctrl-C to stop." in out.read_text(), 120, 0.2)
        text = out.read_text()
        assert "install the train extra: pip install 'trainguard[train]'" in text, text
        [token] = re.findall(r"\(token: ([^)]+)\)", text)
        headers = {"Authorization": f"Bearer {token}"}

        def nodes() -> list[str]:
            got = httpx.get(f"http://127.0.0.1:{port}/api/v1/nodes", headers=headers)
            return sorted(n["name"] for n in got.json())

        assert wait_for(lambda: nodes() == ["demo-node-0", "demo-node-1", "demo-node-2"], 60, 0.5)
        time.sleep(5)  # the store host used to fail within 2 s and stop the demo
        assert demo_proc.poll() is None, out.read_text()
    finally:
        stop_session(demo_proc)
    assert demo_proc.returncode is not None
    assert "a process exited" not in out.read_text(), out.read_text()
