"""The demo job's process handling (backend/demojob.py) on real processes: the tree below a
process, a daemonized descendant kept in it by a subreaper, and ending all of them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.support import wait_for
from trainguard.backend import demojob

# A parent that ignores SIGTERM, with a child in a session of its own (as ft_launcher
# starts its workers).
STUBBORN = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                     start_new_session=True)
    time.sleep(120)
    """
)

# A subreaper whose child daemonizes a grandchild the way NVRx's Wrapper starts its monitor
# process (fork, setsid, fork, the middle one exits), then ends everything below itself.
SUBREAPER = textwrap.dedent(
    """
    import os, sys, time
    from trainguard.backend import demojob
    assert demojob.become_subreaper()
    child = os.fork()
    if child == 0:
        if os.fork() > 0:
            os._exit(0)
        os.setsid()
        if os.fork() > 0:
            os._exit(0)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # as a daemon does: the test's pipes do not wait for it
            os.dup2(null, fd)
        time.sleep(120)
        os._exit(0)
    os.waitpid(child, 0)
    me, deadline = os.getpid(), time.monotonic() + 20
    while True:
        demojob.reap_adopted(set())  # the middle process, which exited
        tree = {p: t for p, t in demojob.process_tree(me).items() if demojob.alive(p, t)}
        if len(tree) == 1:
            break
        assert time.monotonic() < deadline, f"the daemon was not adopted: {tree}"
        time.sleep(0.05)
    (daemon,) = tree
    assert demojob.end_processes(tree, grace=5.0) == {}
    demojob.reap_adopted(set())
    assert demojob._stat(daemon) is None  # ended and reaped
    print("adopted and ended", daemon)
    """
)


def test_process_tree_and_end_processes_reach_a_child_in_its_own_session() -> None:
    parent = subprocess.Popen([sys.executable, "-c", STUBBORN])
    try:
        tree = wait_for(lambda: len(t := demojob.process_tree(parent.pid)) == 1 and t, 30)
        tree[parent.pid] = demojob.process_tree(os.getpid())[parent.pid]
        assert all(demojob.alive(pid, start) for pid, start in tree.items())
        # SIGTERM is ignored by the parent: SIGKILL after the grace period ends it too.
        assert demojob.end_processes(tree, grace=0.5) == {}
        assert not any(demojob.alive(pid, start) for pid, start in tree.items())
    finally:
        parent.kill()
        parent.wait()


def test_alive_tells_a_process_from_a_later_one_with_its_pid() -> None:
    me = os.getpid()
    start = demojob.process_tree(os.getppid())[me]
    assert demojob.alive(me, start)
    assert not demojob.alive(me, start + 1)


def test_a_subreaper_keeps_daemonized_descendants_in_its_tree() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SUBREAPER],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=demojob.ROOT,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("adopted and ended")
