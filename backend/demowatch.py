"""The demo's view of its runs through the server's API (backend/demo.py): whether a run
trained at all (`StartWatch`, which says why after runs that never did), and what a
scheduler would do for its imitated nodes (`Scheduler`: a readmitted node gets its
launcher back, as the job's new hot spare)."""

from __future__ import annotations

import contextlib
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from subprocess import Popen
from urllib.error import HTTPError, URLError
from urllib.request import Request, urlopen

# A run that ended without one step reaching the backend did not start. From the
# FAILED_STARTS_SAID-th such run in a row on, the demo says why (the launchers' last error
# line) and waits before the next run, twice as long each time, up to BACKOFF_MAX_S.
FAILED_STARTS_SAID = 3
BACKOFF_FIRST_S = 10.0
BACKOFF_MAX_S = 120.0
_ERROR_WORDS = re.compile(r"error|exception|closing|failed|refused", re.IGNORECASE)


def last_error_line(workdir: Path) -> str:
    """The last line of the run's launcher logs that reads like an error (else its last
    line): what the launcher said when it gave up, e.g. NVRx 0.7's closed rendezvous."""
    last, error = "", ""
    for log in sorted(workdir.glob("launcher-*.log")):
        for raw in log.read_text(errors="replace").splitlines():
            line = raw.strip()
            if not line:
                continue
            last = line
            if _ERROR_WORDS.search(line) and not line.startswith(("File ", "Traceback")):
                error = line
    return (error or last or "the launchers printed nothing")[-400:]


class StartWatch:
    """Counts the demo's runs that never trained, and says so (see FAILED_STARTS_SAID)."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token
        self.failed = 0  # runs in a row that ended without a step

    def ended(self, job: str, workdir: Path) -> float:
        """Run `job` ended: the seconds to wait before the next run."""
        if self.trained(job):
            self.failed = 0
            return 0.0
        self.failed += 1
        if self.failed < FAILED_STARTS_SAID:
            return 0.0
        delay = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** (self.failed - FAILED_STARTS_SAID))
        said = last_error_line(workdir)
        print(
            f"trainguard demo: the job does not start ({self.failed} runs in a row ended "
            f"without a step); the launcher said: {said}; next run in {delay:.0f} s (logs "
            f"in {workdir})",
            file=sys.stderr,
            flush=True,
        )
        self.report(job, f"{said} ({self.failed} runs in a row ended without a step)")
        return delay

    def report(self, job: str, reason: str) -> None:
        """The dashboard shows it: the job reads failed, "the job does not start: ...",
        with an incident (POST /jobs/{job}/launch-failures). Best effort: the terminal
        line above has said it already."""
        req = Request(
            f"{self.url}/api/v1/jobs/{job}/launch-failures",
            data=json.dumps({"reason": reason[:2000]}).encode(),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
            method="POST",
        )
        with contextlib.suppress(URLError, OSError), urlopen(req, timeout=5):
            pass

    def trained(self, job: str) -> bool:
        """Whether any step of `job` reached the backend. Unknown (the server did not
        answer) counts as trained: the demo does not hold back on its own trouble."""
        req = Request(
            f"{self.url}/api/v1/jobs/{job}", headers={"Authorization": f"Bearer {self.token}"}
        )
        try:
            with urlopen(req, timeout=5) as resp:
                return json.load(resp).get("last_step") is not None
        except HTTPError as exc:
            return exc.code != 404
        except (URLError, OSError, ValueError):
            return True


def spares(nodes: int) -> int:
    """Hot spares among the demo's nodes: one from three nodes on (two train, one waits)."""
    return 1 if nodes >= 3 else 0


def relaunch_readmitted(
    procs: list[Popen],
    names: list[str],
    cordoned: Callable[[str], bool | None],
    start: Callable[[int], Popen],
) -> list[int]:
    """As a cluster's scheduler would, while the run goes on: a node whose launcher ended
    (it left the job, excluded) and that is no longer cordoned (readmitted; None: not
    known) gets its launcher again, in `procs`, and waits as the run's next spare.
    Returns the indices started again; none once the whole run has ended."""
    if all(p.poll() is not None for p in procs):
        return []
    back = []
    for i, p in enumerate(procs):
        if p.poll() is not None and cordoned(names[i]) is False:
            procs[i] = start(i)
            back.append(i)
    return back


class Scheduler:
    """What a cluster's scheduler does for the demo's imitated nodes: a node that left the
    job (trainguard excluded it and its agent ended the node's launcher) gets a launcher
    again once it is readmitted, and waits there as the job's new hot spare."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token

    def cordoned(self, node: str) -> bool | None:
        """Whether the node is cordoned (None: the server did not say)."""
        req = Request(
            f"{self.url}/api/v1/nodes/{node}", headers={"Authorization": f"Bearer {self.token}"}
        )
        try:
            with urlopen(req, timeout=5) as resp:
                return bool(json.load(resp).get("cordoned"))
        except (URLError, OSError, ValueError):
            return None
