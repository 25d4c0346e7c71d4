"""Hostile clients of issue 19, and the honest client that measures what they
do to everybody else.  Used by the hostile-client tests and by
benchmarks/topiclist_attacks.py; an operator can point them at a test broker
to see what a setting does.  Loopback only by intent: every attack is
bounded in connections, bytes and time, ends when its task is cancelled, and
refuses a service that is not on loopback.

Each attack is an async function that sets itself up, then holds what it made
the server hold until cancelled, closing its connections on the way out:

* non_reader: pipelines topic listings and never reads (PINGs keep it
  "alive"), which pinned the memory pools (finding 1);
* subscribe_names: SUBSCRIBE frames with multi-megabyte topic names (2a);
* partial_frames: connections each holding a frame one byte short (2b);
* pipelined_lookups: LOOKUPs and unsupported commands, never reading the
  answers (2c);
* watchers: thousands of topic-list watchers (2d, 3);
* stalled_admin: admin HTTP connections that send half a request head and
  stall (issue 32, G3: they used to be kept open until the file
  descriptors ran out and the binary port stopped accepting).
"""

from __future__ import annotations

import asyncio
import ipaddress
import multiprocessing
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from . import protocol
from .protocol import CommandType, ServerError

#: Receive buffer of a client that does not read: small, so the server's
#: writes back up at once instead of filling the kernel's buffers.
SMALL_RCVBUF = 4096


async def connect(url: str, *, rcvbuf: Optional[int] = None,
                  timeout: float = 10.0) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw connection after CONNECT/CONNECTED (rcvbuf: SO_RCVBUF set
    before connecting, for clients that will not read).  ValueError for a
    service that is not on this machine's loopback: these are test tools."""
    host, port = protocol.parse_url(url)
    check_loopback(host)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    try:
        await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, (host, port)),
                               timeout)
    except BaseException:
        sock.close()
        raise
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(protocol.encode(protocol.cmd(CommandType.CONNECT, "connect",
                                              client_version="hostile",
                                              protocol_version=protocol.PROTOCOL_VERSION)))
    try:
        first, _ = await asyncio.wait_for(protocol.read_command(reader, protocol.ANY_FRAME),
                                          timeout)
    except BaseException:
        writer.transport.abort()
        raise
    if first is None or first.type != CommandType.CONNECTED:
        writer.transport.abort()
        raise protocol.ProtocolError("no CONNECTED")
    return reader, writer


def check_loopback(host: str) -> None:
    """ValueError unless every address of `host` is a loopback address."""
    try:
        addrs = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except socket.gaierror as exc:
        raise ValueError(f"cannot resolve {host}: {exc}") from None
    if not addrs or not all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs):
        raise ValueError(f"hostile clients attack services on loopback only, not {host}")


def _abort_all(writers) -> None:
    for w in writers:
        w.transport.abort()


def list_frame(rid: int, namespace: str) -> bytes:
    """GET_TOPICS_OF_NAMESPACE as bytes."""
    return protocol.encode(protocol.cmd(CommandType.GET_TOPICS_OF_NAMESPACE,
                                        "getTopicsOfNamespace", request_id=rid,
                                        namespace=namespace))


async def _drain_within(w: asyncio.StreamWriter, timeout: float) -> bool:
    """Whether ``w`` drained within ``timeout`` s (False also when the
    connection broke).  Not asyncio.wait_for: on 3.10/3.11 it can swallow a
    cancellation that lands as the drain completes, and an attack told to
    stop would then hold its connection for ever."""
    drain = asyncio.ensure_future(w.drain())
    try:
        done, _ = await asyncio.wait({drain}, timeout=timeout)
    finally:
        if not drain.done():
            drain.cancel()
    if not done:
        return False
    return drain.exception() is None


async def _hold(seconds: Optional[float]) -> None:
    if seconds is None:
        await asyncio.Event().wait()
    else:
        await asyncio.sleep(seconds)


async def non_reader(url: str, namespace: str, *, requests: int = 600,
                     ping_every: float = 10.0) -> None:
    """Finding 1: pipeline `requests` listings, never read; a PING every
    `ping_every` s (inbound traffic, which fooled keep-alive).  When the
    server closes the connection, connect again and repeat."""
    while True:
        try:
            _, w = await connect(url, rcvbuf=SMALL_RCVBUF)
        except (OSError, asyncio.TimeoutError, protocol.ProtocolError):
            await asyncio.sleep(0.2)
            continue
        try:
            w.write(b"".join(list_frame(i, namespace) for i in range(1, requests + 1)))
            ping = protocol.encode(protocol.cmd(CommandType.PING, "ping"))
            while not w.transport.is_closing():
                await asyncio.sleep(ping_every)
                w.write(ping)
        except (ConnectionError, OSError):
            pass
        finally:
            w.transport.abort()
        await asyncio.sleep(0.1)


async def subscribe_names(url: str, *, frames: int = 60, name_bytes: int = 4 * 1024 * 1024,
                          hold: Optional[float] = None) -> None:
    """Finding 2a: SUBSCRIBE frames with a name of `name_bytes`, each with
    its own consumer id, answers read; then hold the connection."""
    r, w = await connect(url)
    name = "persistent://public/default/" + "n" * name_bytes
    try:
        for i in range(frames):
            w.write(protocol.encode(protocol.cmd(
                CommandType.SUBSCRIBE, "subscribe", topic=name, subscription="s", subType=0,
                consumer_id=i, request_id=i)))
            await w.drain()
            await protocol.read_command(r, protocol.ANY_FRAME)
        await _hold(hold)
    except (ConnectionError, OSError, asyncio.IncompleteReadError, protocol.ProtocolError):
        await _hold(hold)
    finally:
        w.transport.abort()


async def partial_frames(url: str, *, connections: int = 100,
                         frame_bytes: int = protocol.DEFAULT_MAX_FRAME,
                         hold: Optional[float] = None, send_timeout: float = 5.0) -> None:
    """Finding 2b: `connections` connections, each sending a frame of
    `frame_bytes` but its last byte.  What the server will not read in
    `send_timeout` s stays unsent."""
    writers = []
    try:
        for _ in range(connections):
            try:
                _, w = await connect(url)
            except (OSError, asyncio.TimeoutError, protocol.ProtocolError):
                continue
            writers.append(w)
            w.write(struct.pack(">I", frame_bytes - 4) + bytes(frame_bytes - 5))
        deadline = time.monotonic() + send_timeout
        for w in writers:
            await _drain_within(w, max(0.01, deadline - time.monotonic()))
        await _hold(hold)
    finally:
        _abort_all(writers)


async def pipelined_lookups(url: str, *, count: int = 200_000, unsupported: bool = False,
                            hold: Optional[float] = None, send_timeout: float = 10.0) -> None:
    """Finding 2c: `count` LOOKUPs (or commands the service does not
    support) pipelined on one connection that never reads.  What the server
    will not read in `send_timeout` s stays unsent."""
    _, w = await connect(url, rcvbuf=SMALL_RCVBUF)
    if unsupported:
        one = protocol.cmd(CommandType.PRODUCER, "producer", request_id=1)
    else:
        one = protocol.cmd(CommandType.LOOKUP, "lookupTopic", request_id=1,
                           topic="persistent://public/default/t")
    batch = protocol.encode(one) * 4096    # the same request id: nobody reads the answers
    try:
        for _ in range(0, count, 4096):
            w.write(batch)
            if not await _drain_within(w, send_timeout):
                break
        await _hold(hold)
    finally:
        w.transport.abort()


@dataclass
class WatcherStorm:
    """What a watcher storm got: watchers created, refusals by error code."""

    created: int = 0
    refused: dict = field(default_factory=dict)


async def watchers(url: str, namespace: str, *, count: int = 5000, per_connection: int = 5000,
                   pattern: Optional[str] = None, hold: Optional[float] = None,
                   result: Optional[WatcherStorm] = None) -> WatcherStorm:
    """Findings 2d and 3: `count` watchers of the whole namespace,
    `per_connection` pipelined on each connection, answers read; then hold
    them.  Refusals are counted in `result` by error code."""
    result = result if result is not None else WatcherStorm()
    pattern = pattern or f"persistent://{namespace}/.*"
    writers, readers = [], []

    async def read_answers(r, w):
        try:
            while True:
                c, _ = await protocol.read_command(r, protocol.ANY_FRAME)
                if c is None:
                    return
                if c.type == CommandType.WATCH_TOPIC_LIST_SUCCESS:
                    result.created += 1
                elif c.type == CommandType.ERROR:
                    name = ServerError.Name(c.error.error)
                    result.refused[name] = result.refused.get(name, 0) + 1
                elif c.type == CommandType.PING:
                    w.write(protocol.encode(protocol.cmd(CommandType.PONG, "pong")))
        except (ConnectionError, OSError, asyncio.IncompleteReadError, protocol.ProtocolError):
            return

    try:
        made = 0
        while made < count:
            n = min(per_connection, count - made)
            r, w = await connect(url)
            writers.append(w)
            readers.append(asyncio.ensure_future(read_answers(r, w)))
            w.write(b"".join(protocol.encode(protocol.cmd(
                CommandType.WATCH_TOPIC_LIST, "watchTopicList", request_id=made + i + 1,
                watcher_id=made + i + 1, namespace=namespace, topics_pattern=pattern))
                for i in range(n)))
            made += n
        await _hold(hold)
    finally:
        for t in readers:
            t.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        _abort_all(writers)
    return result


@dataclass
class AdminStall:
    """What a stalled-admin attack got: connections it opened, and how many
    the server answered 503 (over its cap) or closed (its deadline)."""

    opened: int = 0
    refused: int = 0
    closed: int = 0


async def stalled_admin(admin_url: str, *, connections: int = 1030, hold: Optional[float] = None,
                        result: Optional[AdminStall] = None,
                        connect_timeout: float = 5.0) -> AdminStall:
    """G3: `connections` connections to the admin API, each sending half a
    request head (no blank line) and nothing more, held until cancelled or
    `hold` s; what the server answers is read and counted in `result`.  A
    connection the server closes is not reopened."""
    result = result if result is not None else AdminStall()
    m = re.match(r"^http://([^/:]+):(\d+)/?$", admin_url)
    if not m:
        raise ValueError(f"expected http://host:port, not {admin_url!r}")
    host, port = m[1], int(m[2])
    check_loopback(host)
    head = f"GET /metrics HTTP/1.1\r\nHost: {host}\r\n".encode()
    writers, watchers = [], []

    async def watch(r):
        try:
            first = await r.read(64)
            if first.startswith(b"HTTP/1.1 503"):
                result.refused += 1
            elif not first:
                result.closed += 1
        except (ConnectionError, OSError):
            result.closed += 1

    try:
        for _ in range(connections):
            try:
                r, w = await asyncio.wait_for(asyncio.open_connection(host, port),
                                              connect_timeout)
            except (OSError, asyncio.TimeoutError):
                continue
            w.write(head)
            writers.append(w)
            watchers.append(asyncio.ensure_future(watch(r)))
            result.opened += 1
        await _hold(hold)
    finally:
        for t in watchers:
            t.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)
        _abort_all(writers)
    return result


# ---- the honest client -------------------------------------------------------------


@dataclass
class Probe:
    """One honest listing: seconds from connecting to the answer, and how
    it ended ("served", a ServerError name, or the exception's name)."""

    seconds: float
    outcome: str


async def probe(url: str, namespace: str, *, timeout: float = 30.0) -> Probe:
    """An honest client: connect, CONNECT, list the namespace, close; timed
    from the connect, bounded by `timeout`."""
    t0 = time.perf_counter()
    conn = None
    try:
        async def go():
            nonlocal conn
            conn = await protocol.ClientConnection.open(url, max_frame=protocol.ANY_FRAME,
                                                        timeout=timeout)
            await conn.get_topics(namespace, timeout=timeout)
        await asyncio.wait_for(go(), timeout)
        outcome = "served"
    except protocol.RequestError as exc:
        outcome = ServerError.Name(exc.code)
    except (asyncio.TimeoutError, ConnectionError, OSError, protocol.ProtocolError) as exc:
        outcome = type(exc).__name__
    finally:
        if conn is not None:
            await conn.close()
    return Probe(time.perf_counter() - t0, outcome)


#: What an AttackProcess can run, by name (keyword arguments as above).
ATTACKS = {"non_reader": non_reader, "subscribe_names": subscribe_names,
           "partial_frames": partial_frames, "pipelined_lookups": pipelined_lookups,
           "watchers": watchers, "stalled_admin": stalled_admin}


class AttackProcess:
    """Attacks in a process of their own, all at once: what they cost the
    client side (CPU, memory, the GIL) is not the measuring process's.
    Each attack is (name in ATTACKS, keyword arguments).  `progress` counts
    the answers its watcher storms have read, for a ready() condition."""

    def __init__(self, *attacks: tuple[str, dict]):
        for name, _ in attacks:
            if name not in ATTACKS:
                raise ValueError(f"unknown attack {name!r}; choose from {', '.join(ATTACKS)}")
        ctx = multiprocessing.get_context("spawn")
        self.progress = ctx.Value("q", 0, lock=False)
        self._proc = ctx.Process(target=_run_attacks, args=(list(attacks), self.progress),
                                 daemon=True, name="hostile-client")

    def start(self) -> "AttackProcess":
        """Start the attacks."""
        self._proc.start()
        return self

    def failed(self) -> bool:
        """Whether the attack process ended with an error."""
        code = self._proc.exitcode
        return code is not None and code not in (0, -signal.SIGTERM)

    def stop(self, timeout: float = 30.0, check: bool = True) -> None:
        """End the attacks (SIGTERM: the system closes their connections);
        RuntimeError if they had failed and `check`."""
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(timeout)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        if check and self.failed():
            raise RuntimeError(f"the attacks failed (exit status {self._proc.exitcode}; "
                               "the traceback is on stderr)")


def _run_attacks(attacks, progress) -> None:
    """The body of an AttackProcess."""
    async def main():
        storm = WatcherStorm()

        async def report():
            while True:
                progress.value = storm.created + sum(storm.refused.values())
                await asyncio.sleep(0.05)
        reporter = asyncio.ensure_future(report())
        try:
            await asyncio.gather(*(ATTACKS[name](**(dict(kw, result=storm)
                                                    if name == "watchers" else kw))
                                   for name, kw in attacks))
        finally:
            reporter.cancel()
    asyncio.run(main())


async def probe_during(attack: AttackProcess, url: str, namespace: str, *, duration: float,
                       interval: float = 0.25, warmup: float = 1.0, timeout: float = 30.0,
                       ready: Optional[Callable[[], bool]] = None) -> list[Probe]:
    """Start `attack`; once `ready()` (or after `warmup` s), probe the
    service every `interval` s for `duration` s (one probe at a time, each
    bounded by `timeout`), then stop the attack (raising if it failed).
    The probes."""
    attack.start()
    probes: list[Probe] = []
    try:
        t0 = time.monotonic()
        while not (ready() if ready else time.monotonic() - t0 >= warmup):
            if attack.failed():
                break
            if time.monotonic() - t0 > 120:
                raise TimeoutError("the attack did not get ready in 120 s")
            await asyncio.sleep(0.05)
        end = time.monotonic() + duration
        while time.monotonic() < end and not attack.failed():
            probes.append(await probe(url, namespace, timeout=timeout))
            await asyncio.sleep(interval)
    finally:
        await asyncio.to_thread(attack.stop)
    return probes


# ---- a service in a process of its own, for memory measurements ----------------------


class ServiceProcess:
    """`python -m pylimiter.pulsar.topiclist <role> <args>` in a process of
    its own (so that its memory is its own), from the source tree `tree`
    (None: this interpreter's pylimiter).  Linux: RSS and its high-water
    mark come from /proc."""

    def __init__(self, role: str, *args: str, tree: Optional[str] = None):
        cmd = [sys.executable, "-m", "pylimiter.pulsar.topiclist", role, *args]
        env = dict(os.environ)
        if tree is not None:
            env["PYTHONPATH"] = str(tree)
        self.proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.url = self.admin = None
        for _ in range(5):
            line = self.proc.stdout.readline()
            m = re.match(rf"{role}: (pulsar://\S+)\s+admin: (http://\S+)", line)
            if m:
                self.url, self.admin = m[1], m[2]
                break
        if self.url is None:
            self.proc.kill()
            _, err = self.proc.communicate()
            raise RuntimeError(f"{role} did not start: {err.strip()[-500:]}")

    @property
    def pid(self) -> int:
        """The process id."""
        return self.proc.pid

    def rss(self) -> int:
        """Resident set size now, in bytes."""
        return self._status("VmRSS")

    def peak(self) -> int:
        """Highest resident set size since start or reset_peak(), in bytes."""
        return self._status("VmHWM")

    def reset_peak(self) -> None:
        """Start the high-water mark again from the current RSS."""
        with open(f"/proc/{self.pid}/clear_refs", "w") as f:
            f.write("5")

    def _status(self, key: str) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError(f"no {key} in /proc/{self.pid}/status")

    def stop(self, timeout: float = 60.0) -> tuple[float, int, str]:
        """SIGTERM; (seconds until it exited, exit status, its stderr).
        Killed if it has not exited within `timeout` (then inf seconds)."""
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            _, err = self.proc.communicate(timeout=timeout)
            return time.monotonic() - t0, self.proc.returncode, err
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
            return float("inf"), self.proc.returncode, err
