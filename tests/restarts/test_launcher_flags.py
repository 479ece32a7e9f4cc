"""The demo's ft_launcher command passes only the flags the installed ft_launcher accepts
(backend/demojob.py). The help texts under data/ are ft_launcher's `--help` of NVRx 0.4.1
(installed here), 0.6.0 and 0.7.0-main (their argparse parsers built from the tagged
sources: their wheels need glibc 2.39), recorded with COLUMNS=1000."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.backend import demojob

DATA = Path(__file__).resolve().parent / "data"
MEASURED = dict(demojob.FT_OPTIONS)


def options(version: str) -> dict[str, frozenset[str] | None]:
    return demojob.parse_help_options((DATA / f"ft_launcher-help-{version}.txt").read_text())


def as_dict(args: list[str]) -> dict[str, str]:
    return dict(zip(args[::2], args[1::2], strict=True))


def test_nvrx_0_4_1_gets_the_whole_measured_configuration() -> None:
    opts = options("0.4.1")
    assert opts["--ft-restart-policy"] == frozenset({"any-failed", "min-healthy"})
    assert as_dict(demojob.supported_options(demojob.FT_OPTIONS, opts)) == MEASURED


@pytest.mark.parametrize("version", ["0.6.0", "0.7.0-main"])
def test_nvrx_0_6_and_later_get_no_min_healthy_policy(version: str) -> None:
    opts = options(version)
    assert opts["--ft-restart-policy"] == frozenset({"any-failed"})
    got = as_dict(demojob.supported_options(demojob.FT_OPTIONS, opts))
    assert got == {k: v for k, v in MEASURED.items() if k != "--ft-restart-policy"}
    # the rendezvous flags the command always passes are there too
    for flag in ("--nnodes", "--nproc-per-node", "--rdzv-backend", "--rdzv-endpoint"):
        assert flag in opts
    assert "--rdzv-id" in opts and "--max-restarts" in opts


def test_a_flag_the_launcher_dropped_is_not_passed() -> None:
    opts = {k: v for k, v in options("0.6.0").items() if k != "--ft-enable-nic-monitor"}
    assert "--ft-enable-nic-monitor" not in demojob.supported_options(demojob.FT_OPTIONS, opts)


def test_unknown_options_pass_the_measured_configuration() -> None:
    assert as_dict(demojob.supported_options(demojob.FT_OPTIONS, None)) == MEASURED


def test_flags_named_in_help_prose_are_not_options() -> None:
    text = (
        "options:\n"
        "  --standalone          Start a local standalone rendezvous. If specified\n"
        "                        --rdzv-backend, --rdzv-id are auto-assigned.\n"
        "  --ft-x {a,b}, --ft_x {a,b}\n"
        "                        Deprecated; see --ft-y.\n"
    )
    assert demojob.parse_help_options(text) == {
        "--standalone": None,
        "--ft-x": frozenset({"a", "b"}),
        "--ft_x": frozenset({"a", "b"}),
    }


def test_the_launcher_command_reads_the_installed_launcher() -> None:
    # the installed ft_launcher (NVRx 0.4.1 in CI) is asked once; its answer decides
    demojob.launcher_options.cache_clear()
    cmd = demojob.launcher_command(2, 2, 29500, "job", 3, ["--steps", "5"])
    installed = demojob.launcher_options(tuple(demojob.ft_launcher_head()))
    assert installed is not None and "--ft-restart-policy" in installed
    expected = demojob.supported_options(demojob.FT_OPTIONS, installed)
    assert cmd[-len(expected) - 3 : -3] == expected
    assert cmd[-3:] == [str(demojob.TRAIN_SCRIPT), "--steps", "5"]
