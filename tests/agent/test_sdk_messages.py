"""The SDK <-> agent datagrams (trainguard.protocol.messages): every message type survives
encode and decode, a datagram of another version or a malformed one is refused with its
reason, the datagrams of SDKs from before the Structs still read as version 1, and the
SDK's steps never exceed the datagram size the agent reads."""

from __future__ import annotations

import fractions
import socket
import threading
import time
from pathlib import Path
from typing import Any, get_args

import pytest

from trainguard.protocol import messages as m
from trainguard.sdk.restart import RestartRequested, Restarts
from trainguard.sdk.transport import Transport

TS = 1_712_345_678.123456
IDENTITY: dict[str, Any] = dict(
    job="job1",
    rank=3,
    pid=4242,
    local_rank=1,
    world_size=8,
    attempt=2,
    iteration=1,
    ppid=4000,
    last_step=99,
    dropped=5,
    ts=TS,
    display_name="train-3f2a1c4d",
    launcher="ft_launcher",
    in_process=True,
)

SAMPLES: list[m.Message] = [
    m.Hello(**IDENTITY),
    m.Heartbeat(**IDENTITY),
    m.Iteration(**IDENTITY),
    m.Bye(**IDENTITY, clean=False, uncaught="ValueError", exit_code=3),
    m.Steps(steps=[m.StepTiming(1, TS, TS + 0.5), m.StepTiming(2, TS + 0.5, TS + 1, 0.25)]),
    m.Interrupted(reason="peer failed", step=7, ts=TS),
    m.ExceptionReport(
        exc_type="RuntimeError",
        message="boom",
        traceback="Traceback ...",
        step=7,
        uncaught=True,
        thread="loader",
        ts=TS,
    ),
    m.Checkpoint(phase="save_end", step=100, blocking_s=1.5, ok=True, ts=TS),
    m.RestartReceived(request_id="req-1", ts=TS),
    m.RestartRaised(request_id="req-1", ts=TS),
    m.Finished(step=1000, ts=TS),
    m.Log(message="lr changed", data={"lr": 0.1, "note": "warmup"}, ts=TS),
    m.InjectXid(gpu=1, xid=79, message="fault injection", ts=TS),
]


def test_the_samples_cover_every_message_type() -> None:
    assert {type(s) for s in SAMPLES} == set(get_args(m.FromSdk))


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda s: type(s).__name__)
def test_every_sdk_message_round_trips(msg: m.Message) -> None:
    data = m.encode(msg)
    assert b'"version":1' in data
    assert m.decode_from_sdk(data) == msg


def test_the_agents_restart_request_round_trips() -> None:
    msg = m.Restart(job="job1", request_id="req-9", reason="xid 13")
    assert m.decode_from_agent(m.encode(msg)) == msg
    with pytest.raises(m.Rejected, match="malformed"):  # the agent sends no hello
        m.decode_from_agent(m.encode(SAMPLES[0]))


def test_a_datagram_of_an_sdk_from_before_the_structs_reads_as_version_1() -> None:
    # no "version" key, no declarations, compute left out of a step: what those SDKs sent
    hello = m.decode_from_sdk(b'{"t":"hello","job":"old","rank":0,"pid":12,"ts":1.5}')
    assert isinstance(hello, m.Hello) and hello.version == 1
    assert (hello.job, hello.rank, hello.pid, hello.world_size) == ("old", 0, 12, 1)
    assert hello.launcher is m.UNSET and hello.in_process is m.UNSET
    steps = m.decode_from_sdk(b'{"t":"steps","v":[[1,2.0,3.0],[2,3.0,4.0,0.5]]}')
    assert isinstance(steps, m.Steps)
    assert steps.steps == [m.StepTiming(1, 2.0, 3.0), m.StepTiming(2, 3.0, 4.0, 0.5)]


@pytest.mark.parametrize(
    "data",
    [
        b'{"t":"hello","job":"j","rank":0,"pid":1,"version":2}',
        b'{"t":"teleport","version":2}',  # a type this version does not know either
    ],
)
def test_another_version_is_refused_as_such(data: bytes) -> None:
    with pytest.raises(m.Rejected) as refused:
        m.decode_from_sdk(data)
    assert refused.value.reason == "version" and "version 2" in refused.value.detail


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"\xff\x00not json", "malformed"),
        (b"[1, 2]", "Expected `object`"),
        (b'{"t":"teleport"}', "Invalid value 'teleport'"),
        (b'{"job":"j","rank":0,"pid":1}', "missing required field `t`"),
        (b'{"t":"hello","job":"j","pid":1}', "missing required field `rank`"),
        (b'{"t":"hello","job":"j","rank":"0","pid":1}', "$.rank"),
        (b'{"t":"steps","v":[[-1,2.0,3.0]]}', "$.v[0][0]"),
        (b'{"t":"hello","job":"j","rank":0,"pid":1,"version":"1"}', "$.version"),
        (b'{"t":"step","s":1,"a":2.0,"b":3.0}', "Invalid value 'step'"),  # superseded
    ],
)
def test_a_malformed_datagram_is_refused_saying_why(data: bytes, says: str) -> None:
    with pytest.raises(m.Rejected) as refused:
        m.decode_from_sdk(data)
    assert refused.value.reason == "malformed" and says in refused.value.detail


def test_numbers_of_other_libraries_are_sent_as_numbers() -> None:
    numpy = pytest.importorskip("numpy")

    class Scalar:  # a one-element tensor
        def item(self) -> float:
            return 0.5

    steps = m.Steps(steps=[m.StepTiming(numpy.int64(7), fractions.Fraction(3, 2), 2.0, Scalar())])
    assert m.decode_from_sdk(m.encode(steps)) == m.Steps(steps=[m.StepTiming(7, 1.5, 2.0, 0.5)])
    with pytest.raises(TypeError, match="cannot send a object"):
        m.encode(m.Log(message="x", data={"what": object()}))


def _receiver(tmp_path: Path) -> tuple[socket.socket, str]:
    path = str(tmp_path / "agent.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
    sock.bind(path)
    sock.settimeout(5)
    return sock, path


def test_steps_are_split_so_that_no_datagram_exceeds_what_the_agent_reads(
    tmp_path: Path,
) -> None:
    sock, path = _receiver(tmp_path)
    transport = Transport(path, f"test-sdk-{id(tmp_path):x}")
    # the longest numbers a step can carry: one datagram of them would be ~90 KB
    steps = [
        m.StepTiming(2**62 + n, TS + n / 3, TS + n / 7, 1 / 3 + n)
        for n in range(m.STEPS_PER_DATAGRAM)
    ]
    try:
        transport.send_steps(steps)
        got: list[m.StepTiming] = []
        sizes = []
        while len(got) < len(steps):
            data = sock.recv(m.MAX_DATAGRAM + 1)
            sizes.append(len(data))
            msg = m.decode_from_sdk(data)
            assert isinstance(msg, m.Steps)
            got += msg.steps
    finally:
        transport.close()
        sock.close()
    assert len(sizes) > 1 and max(sizes) <= m.MAX_DATAGRAM
    assert got == steps and transport.sent == len(sizes) and transport.dropped == 0


def test_a_lost_datagram_of_steps_counts_each_step(tmp_path: Path) -> None:
    transport = Transport(str(tmp_path / "nobody.sock"), f"test-sdk-lost-{id(tmp_path):x}")
    try:
        transport.send_steps([m.StepTiming(n, TS, TS + 1) for n in range(10)])
        assert transport.send(m.Finished(step=9, ts=TS)) is False
    finally:
        transport.close()
    assert (transport.sent, transport.dropped) == (0, 11)


def test_the_sdk_acts_on_a_restart_for_its_job_only_and_ignores_the_rest() -> None:
    sent: list[m.Message] = []
    closed = threading.Event()
    restarts = Restarts("job1", 2.0, lambda msg: sent.append(msg) is None, closed, lambda: None)
    datagrams = [
        m.encode(m.Restart(job="job1", request_id="from-the-future")).replace(
            b'"version":1', b'"version":2'
        ),
        b"not json",
        m.encode(m.Restart(job="other", request_id="not-ours")),
        m.encode(m.Restart(job="job1", request_id="ours", reason="test")),
        m.encode(m.Restart(job=None, request_id="any-job")),
        None,  # the socket closed: the listener ends
    ]
    restarts.listen(iter(datagrams).__next__)
    assert restarts.requests == 2 and restarts.pending
    assert (restarts.request_id, restarts.reason) == ("any-job", "")
    assert [type(msg) for msg in sent] == [m.RestartReceived, m.RestartReceived]
    assert [msg.request_id for msg in sent] == ["ours", "any-job"]  # type: ignore[attr-defined]  # all RestartReceived, checked above


def test_a_pending_restart_is_raised_and_reported() -> None:
    sent: list[m.Message] = []
    raised: list[float] = []
    restarts = Restarts(
        "job1",
        2.0,
        lambda msg: sent.append(msg) is None,
        threading.Event(),
        lambda: raised.append(time.time()),
    )
    restarts.request("req-1", "xid 13")
    with pytest.raises(RestartRequested, match="xid 13"):
        restarts.raise_now()
    assert not restarts.pending
    assert len(raised) == 1
    assert isinstance(sent[-1], m.RestartRaised) and sent[-1].request_id == "req-1"
