"""The balancer while a group dies: HAProxy, with the configuration every balancer runs, in front
of two stand-ins for a group's llama-server on loopback.

A main node that loses a worker aborts (llama.cpp #26724): the requests it has open end without
an answer, closed or reset, and then its port refuses until its supervisor has restarted it and
/health answers 200 again. Every request that got no byte back is answered by the other group,
even when the dying group was the only one with a free slot; one whose answer had begun (a
stream) is not sent again, and its client sees the cut; a group whose /health says it is loading
gets nothing; one that outlasts the server timeout (a whole generation's time) is not started
again. A request is sent again only from a copy of it whole: one within the buffer's bound is, a
larger one is not. Traffic goes only to loopback.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import ipaddress
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from infra.boot import balancer as boot
from infra.boot.balancer import SERVED_BY_HEADER, balancer_boot
from infra.local import balancer as lb
from tests.conftest import free_port, require_tool

MAINS = ("127.0.0.10", "127.0.0.30")
LISTEN = "127.0.0.5"
# What a stand-in sends before it dies in the middle of an answer: headers cut short (nothing
# reaches the client), or a stream's headers and first event (the client has them).
CUT_HEADERS = b"HTTP/1.1 200 OK\r\nContent-Ty"
STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)
FIRST_EVENT = b'data: {"content": "Hello"}\n\n'
# A request to this path is answered after SLOW_SECONDS, whatever the group's state: it holds
# the group's one slot meanwhile.
SLOW_PATH = "/slow"
SLOW_SECONDS = 2.0
# A request to this path is a generation: it holds the group's slot for GENERATE_SECONDS, unless
# its connection closes first (llama-server checks, and stops generating what nobody will read).
GENERATE_PATH = "/generate"
GENERATE_SECONDS = 2.5


@dataclass
class Group:
    """A loopback stand-in for a group's main node. ``/health`` answers ``health``; every other
    request is read whole, recorded, and then, by ``failure``: answered with the group's name
    (None), closed with no answer ("close"), reset ("reset"), closed with its listening socket as
    when the process exits ("exit"), answered with headers cut short ("cut-headers"), or with a
    stream's first event and then closed ("cut-stream")."""

    name: str
    ip: str
    port: int
    health: int = 200
    failure: str | None = None
    requests: list[tuple[str, int]] = field(default_factory=list)
    # Each generation's end: seconds until its connection closed, or None if it ran to the end.
    generations: list[float | None] = field(default_factory=list)
    listener: socket.socket | None = None

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.ip, self.port))
        listener.listen(64)
        self.listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stop(self) -> None:
        """Stop listening at once, as when the process exits: new connections are refused (a
        listening socket closed while a thread waits in accept() would go on listening)."""
        if self.listener is not None:
            with contextlib.suppress(OSError):
                self.listener.shutdown(socket.SHUT_RDWR)
            self.listener.close()
            self.listener = None

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        # HAProxy may have closed the connection by the time the answer is written (a check done,
        # a request it timed out): the answer then goes nowhere.
        with connection, connection.makefile("rb") as stream, contextlib.suppress(OSError):
            while request := _read_request(stream):
                path, body = request
                if path == "/health":
                    _answer(connection, self.health, b"{}")
                    continue
                self.requests.append((path, len(body)))
                if path == SLOW_PATH:
                    time.sleep(SLOW_SECONDS)
                elif path == GENERATE_PATH:
                    closed_after = _closed_within(connection, GENERATE_SECONDS)
                    self.generations.append(closed_after)
                    if closed_after is not None:
                        return
                elif self.failure is not None:
                    self._fail(connection, self.failure)
                    return
                _answer(connection, 200, self.name.encode())

    def _fail(self, connection: socket.socket, failure: str) -> None:
        if failure == "reset":
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        elif failure == "exit":
            self.stop()
        elif failure == "cut-headers":
            connection.sendall(CUT_HEADERS)
        elif failure == "cut-stream":
            connection.sendall(STREAM_HEAD + b"%x\r\n%s\r\n" % (len(FIRST_EVENT), FIRST_EVENT))
        else:
            assert failure == "close", failure
        connection.close()


def _read_request(stream: io.BufferedReader) -> tuple[str, bytes] | None:
    try:
        line = stream.readline()
        if not line:
            return None
        length = 0
        while (header := stream.readline()) not in (b"\r\n", b""):
            name, _, value = header.decode().partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        body = stream.read(length)
    except OSError:  # HAProxy closed a check's connection, or the stand-in its own
        return None
    return line.decode().split()[1], body


def _closed_within(connection: socket.socket, seconds: float) -> float | None:
    """Seconds until the peer closed the connection (read end of file), or None if it was
    still open after ``seconds``."""
    started = time.monotonic()
    while (left := seconds - (time.monotonic() - started)) > 0:
        readable, _, _ = select.select([connection], [], [], left)
        if readable:
            try:
                if not connection.recv(1, socket.MSG_PEEK):
                    return time.monotonic() - started
            except ConnectionResetError:
                return time.monotonic() - started
            time.sleep(0.01)  # bytes, not a close: nothing more is expected on it
    return None


def _answer(connection: socket.socket, status: int, body: bytes) -> None:
    head = f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    connection.sendall(head + body)


@dataclass
class Reply:
    status: int | None  # None: no complete answer
    group: str | None
    body: bytes
    error: str = ""


def raw_request(path: str, body: bytes) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: {LISTEN}\r\nContent-Type: application/json\r\n"
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


def send(port: int, path: str = "/completion", body: bytes = b"{}", pause: float = 0.1) -> Reply:
    """One request through the balancer, its headers first and its body ``pause`` seconds later,
    as a client may send them (Python's own HTTP client sends them in two writes)."""
    request = raw_request(path, body)
    split = len(request) - len(body)
    with socket.create_connection((LISTEN, port), timeout=30) as client:
        client.sendall(request[:split])
        time.sleep(pause)
        client.sendall(request[split:])
        response = http.client.HTTPResponse(client)
        try:
            response.begin()
        except (http.client.HTTPException, OSError) as error:
            return Reply(None, None, b"", repr(error))
        group = response.headers.get(SERVED_BY_HEADER)
        try:
            return Reply(response.status, group, response.read())
        except http.client.IncompleteRead as cut:
            return Reply(None, group, cut.partial, repr(cut))


@dataclass
class Pair:
    groups: tuple[Group, Group]
    balancer: lb.Balancer
    port: int

    def wait_for(self, states: dict[str, str], timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while (now := self.balancer.group_states()) != states:
            assert time.monotonic() < deadline, now
            time.sleep(0.05)

    def log(self) -> str:
        return self.balancer.log.read_text(errors="replace")


UP = {"group1": "UP", "group2": "UP"}


def start_pair(directory: Path, edit: tuple[str, str] | None = None) -> Pair:
    """Two stand-in groups of one slot each behind HAProxy on loopback (``edit``: one line of
    the rendered configuration replaced, to show what it is for)."""
    require_tool("haproxy")
    port = free_port()
    groups = (Group("group1", MAINS[0], port), Group("group2", MAINS[1], port))
    config = balancer_boot(ipaddress.IPv4Network("127.0.0.0/24"), list(MAINS), server_port=port,
                           slots=1, timeout_seconds=600)  # fmt: skip
    assert config is not None and config.listen_ip == LISTEN
    pair = Pair(groups, lb.Balancer(namespace=None, directory=directory), port)
    try:
        for group in groups:
            group.start()
        pair.balancer.write_config(config)
        if edit is not None:
            text = pair.balancer.config.read_text()
            assert edit[0] in text
            pair.balancer.config.write_text(text.replace(edit[0], edit[1]))
        pair.balancer.start()
    except BaseException:
        stop_pair(pair)
        raise
    return pair


def stop_pair(pair: Pair) -> None:
    pair.balancer.stop()
    for group in pair.groups:
        group.stop()
    assert not pair.balancer.alive()


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    started = start_pair(tmp_path / "lb")
    try:
        started.wait_for(UP)
        yield started
    finally:
        stop_pair(started)


@pytest.mark.parametrize("failure", ["close", "reset", "cut-headers"])
def test_every_request_that_got_no_byte_back_is_answered_by_the_other_group(
    pair: Pair, failure: str
) -> None:
    """Group 1 fails every request it gets, while its checks still pass (as an aborting main node
    does until its process is gone): each of them is sent again, to group 2, and answered."""
    dying, alive = pair.groups
    dying.failure = failure
    replies = [send(pair.port) for _ in range(8)]
    assert [(r.status, r.group, r.body) for r in replies] == [(200, "group2", b"group2")] * 8
    # Group 1 got its share first; each was sent again, and group 2 answered every request once.
    assert dying.requests and len(alive.requests) == 8


def test_without_reading_the_request_whole_it_could_not_be_sent_again(tmp_path: Path) -> None:
    """The control: without ``option http-buffer-request`` HAProxy sends the headers on before the
    body has come, keeps no copy, and a request group 1 drops gets HAProxy's 502."""
    pair = start_pair(tmp_path / "lb", edit=("    option http-buffer-request\n", ""))
    try:
        pair.wait_for(UP)
        pair.groups[0].failure = "close"
        replies = [send(pair.port) for _ in range(4)]
        assert 502 in {r.status for r in replies}
    finally:
        stop_pair(pair)


def _busy(pair: Pair) -> tuple[threading.Thread, list[Reply | BaseException], Group, Group]:
    """A slow request holding one group's only slot; returns it, where its reply goes, the busy
    group and the other."""
    held: list[Reply | BaseException] = []

    def hold() -> None:
        try:
            held.append(send(pair.port, SLOW_PATH))
        except BaseException as error:  # shown by the test that waits for it
            held.append(error)
            raise

    thread = threading.Thread(target=hold)
    thread.start()
    deadline = time.monotonic() + 10
    while not any(g.requests for g in pair.groups):
        assert time.monotonic() < deadline and not held, (held, pair.log())
        time.sleep(0.01)
    busy = next(g for g in pair.groups if g.requests)
    other = next(g for g in pair.groups if g is not busy)
    return thread, held, busy, other


def test_a_group_that_dies_with_the_only_free_slot_loses_no_request(pair: Pair) -> None:
    """The other group's slot is busy, so a request goes to the dying group, and its retry goes
    back there (the only server with a free slot): refused, the dying group is taken out, and the
    request waits for the busy group's slot instead of failing."""
    thread, held, busy, dying = _busy(pair)
    dying.failure = "exit"
    reply = send(pair.port)
    thread.join()
    assert isinstance(held[0], Reply) and (held[0].status, held[0].group) == (200, busy.name)
    assert (reply.status, reply.group) == (200, busy.name), reply
    assert dying.requests  # it got the request first
    assert pair.balancer.group_states()[dying.name] == "DOWN"


def test_a_stream_cut_after_its_first_bytes_is_not_sent_again(pair: Pair) -> None:
    """Group 1 sends a stream's headers and first event, then dies: its client gets those bytes
    and then the cut, and the request is not sent again (a second group would stream the whole
    answer after the part already given)."""
    cutting, other = pair.groups
    cutting.failure = "cut-stream"
    replies = [send(pair.port) for _ in range(6)]
    cut = [r for r in replies if r.status is None]
    answered = [r for r in replies if r.status == 200]
    assert len(cut) == len(cutting.requests) > 0
    assert all(r.group == "group1" and r.body == FIRST_EVENT and r.error for r in cut), cut
    assert len(answered) == len(other.requests) == len(replies) - len(cut)
    assert all(r.group == "group2" for r in answered)


def test_a_group_whose_health_says_loading_gets_no_request(tmp_path: Path) -> None:
    """A group whose /health answers 503 (its model loading) is out of rotation from the start,
    and gets requests only once it answers 200."""
    pair = start_pair(tmp_path / "lb")
    loading, serving = pair.groups
    try:
        loading.health = 503
        pair.wait_for({"group1": "DOWN", "group2": "UP"})
        replies = [send(pair.port, pause=0) for _ in range(6)]
        assert {r.group for r in replies} == {"group2"} and not loading.requests
        loading.health = 200
        pair.wait_for(UP)
        assert "group1" in {send(pair.port, pause=0).group for _ in range(4)}
        assert len(serving.requests) + len(loading.requests) == 10
    finally:
        stop_pair(pair)


def test_a_request_is_sent_again_up_to_the_buffers_bound_and_not_past_it(pair: Pair) -> None:
    """A request of RETRIED_REQUEST_BYTES (headers and body) that group 1 drops is answered by
    group 2; one larger than the buffer is sent on as it comes, with no copy, and gets 502."""
    dropping, _ = pair.groups
    dropping.failure = "close"

    def through_group_1(size: int) -> Reply:
        """A request of ``size`` bytes in all, sent until group 1 is the one that gets it."""
        length = size - len(raw_request("/completion", b""))
        length -= len(str(length)) - 1  # Content-Length's digits
        body = b"x" * length
        assert len(raw_request("/completion", body)) == size
        for _ in range(4):
            before = len(dropping.requests)
            reply = send(pair.port, body=body)
            if len(dropping.requests) > before:
                assert dropping.requests[-1][1] == len(body)
                return reply
            pair.wait_for(UP)
        raise AssertionError("group 1 never got the request")

    within = through_group_1(boot.RETRIED_REQUEST_BYTES)
    assert (within.status, within.group) == (200, "group2")
    beyond = through_group_1(boot.BUFFER_BYTES + 1)
    assert beyond.status == 502 and beyond.group is None


def test_a_request_that_outlasts_the_server_timeout_is_not_sent_again(tmp_path: Path) -> None:
    """The server timeout is a whole generation's time: a request that reaches it gets HAProxy's
    504 and is not started again on the other group (here the timeout is cut to 1 s, under the
    stand-in's SLOW_SECONDS)."""
    pair = start_pair(
        tmp_path / "lb", edit=("    timeout server 600s\n", "    timeout server 1s\n")
    )
    try:
        pair.wait_for(UP)
        reply = send(pair.port, SLOW_PATH)
        assert reply.status == 504 and reply.group is None, reply
        assert sorted(len(g.requests) for g in pair.groups) == [0, 1]
    finally:
        stop_pair(pair)


def _give_up(pair: Pair, path: str, after: Callable[[], bool]) -> None:
    """A client that sends a request and closes its connection, unanswered, once ``after``."""
    with socket.create_connection((LISTEN, pair.port), timeout=30) as client:
        client.sendall(raw_request(path, b"{}"))
        deadline = time.monotonic() + 10
        while not after():
            assert time.monotonic() < deadline, pair.log()
            time.sleep(0.01)


def _generations(pair: Pair, count: int) -> list[float | None]:
    deadline = time.monotonic() + GENERATE_SECONDS + 10
    while len(ended := [e for g in pair.groups for e in g.generations]) < count:
        assert time.monotonic() < deadline, pair.log()
        time.sleep(0.01)
    return ended


def test_a_client_that_gives_up_frees_its_groups_slot(pair: Pair) -> None:
    """A client closes its connection while its request generates: the group sees the close at
    once (llama-server then stops generating, and its slot is free), not after the whole
    answer."""
    _give_up(pair, GENERATE_PATH, lambda: any(g.requests for g in pair.groups))
    (closed_after,) = _generations(pair, 1)
    assert closed_after is not None and closed_after < 1, closed_after


def test_without_abortonclose_a_given_up_request_generates_to_the_end(tmp_path: Path) -> None:
    """The control: without ``option abortonclose`` HAProxy keeps the group's connection open
    until the whole answer has come, for a client that is gone."""
    pair = start_pair(tmp_path / "lb", edit=("    option abortonclose\n", ""))
    try:
        pair.wait_for(UP)
        _give_up(pair, GENERATE_PATH, lambda: any(g.requests for g in pair.groups))
        assert _generations(pair, 1) == [None]
    finally:
        stop_pair(pair)


def test_a_request_given_up_in_the_queue_never_reaches_a_group(pair: Pair) -> None:
    """Both groups generate; a third request waits in HAProxy's queue, and its client gives up:
    once the groups are free it is not sent to either (nobody would read its answer)."""
    held = [threading.Thread(target=send, args=(pair.port, GENERATE_PATH)) for _ in range(2)]
    for thread in held:
        thread.start()
    try:
        deadline = time.monotonic() + 10
        while not all(g.requests for g in pair.groups):
            assert time.monotonic() < deadline, pair.log()
            time.sleep(0.01)
        _give_up(pair, GENERATE_PATH, lambda: pair.balancer.queued() == 1)
        assert _generations(pair, 2) == [None, None]  # the held ones, answered
    finally:
        for thread in held:
            thread.join()
    send(pair.port)  # a request after them reaches a group, so the queue has been served
    assert sorted(path for g in pair.groups for path, _ in g.requests) == [
        "/completion",
        GENERATE_PATH,
        GENERATE_PATH,
    ], pair.log()
