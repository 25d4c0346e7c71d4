"""Pulsar binary protocol framing and a small asyncio client connection.

A command frame is  [total size: u32][command size: u32][BaseCommand], sizes
big-endian, total = 4 + command size.  (Message frames carry a payload after
the command; this service never sends or accepts payloads.)
"""

from __future__ import annotations

import asyncio
import itertools
import re
import struct
from typing import Iterable, Optional

import google_crc32c
from google.protobuf.message import DecodeError

from . import pulsar_topiclist_pb2 as pb

BaseCommand = pb.BaseCommand
CommandType = pb.BaseCommand.Type
Mode = pb.CommandGetTopicsOfNamespace.Mode
ServerError = pb.ServerError

PROTOCOL_VERSION = 21
SERVER_VERSION = "pylimiter-topiclist"
#: Pulsar's maxMessageSize default (5 MiB): the largest message a broker
#: accepts, advertised to clients in CONNECTED.
DEFAULT_MAX_MESSAGE_SIZE = 5 * 1024 * 1024
#: What a frame may carry beyond maxMessageSize (Pulsar's
#: Commands.MESSAGE_SIZE_FRAME_PADDING): command and metadata headers.
FRAME_PADDING = 10 * 1024
# What a topic costs in the heap estimate besides its UTF-8 bytes (object
# and list overhead), as in the issue: sum of lengths + 32 per topic.
TOPIC_OVERHEAD = 32

_U32 = struct.Struct(">I")
_U32x2 = struct.Struct(">II")


def max_frame_for(max_message_size: int) -> int:
    """The largest frame accepted, 4-byte length prefix included, as Pulsar's
    frame decoder computes it: maxMessageSize plus the frame padding."""
    return max_message_size + FRAME_PADDING


DEFAULT_MAX_FRAME = max_frame_for(DEFAULT_MAX_MESSAGE_SIZE)
#: Every frame a 4-byte size can describe: the limit for a trusted peer
#: (the proxy reading its broker, whose responses are bounded by memory
#: permits, not by maxMessageSize).
ANY_FRAME = 2**32 + 3
#: Longest ERROR message sent: messages may quote what a client sent.
MAX_ERROR_MESSAGE = 1024
#: Longest topics hash kept from a request (Pulsar's are 8 hex digits).
MAX_HASH_LENGTH = 64


class ProtocolError(Exception):
    """A frame that cannot be a Pulsar command: the connection is closed."""


def encode(cmd: BaseCommand) -> bytes:
    """The frame of a command: total size, command size, command."""
    body = cmd.SerializeToString()
    return _U32x2.pack(len(body) + 4, len(body)) + body


def frame_size(cmd: BaseCommand) -> int:
    """Bytes on the wire for cmd, without serializing it twice."""
    return 8 + cmd.ByteSize()


async def read_frame_header(reader: asyncio.StreamReader, max_frame: int = DEFAULT_MAX_FRAME
                            ) -> Optional[int]:
    """The size of the next frame's body (the total size field); None at a
    clean end of stream.  Raises ProtocolError for a size outside
    8..max_frame: checked before a byte of the body is read, so a peer
    cannot make the reader hold more than max_frame for it."""
    try:
        head = await reader.readexactly(4)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise ProtocolError("truncated frame header") from None
    (total,) = _U32.unpack(head)
    if total < 4 or total + 4 > max_frame:
        raise ProtocolError(f"frame size {total + 4} outside 8..{max_frame} bytes")
    return total


async def read_frame_body(reader: asyncio.StreamReader, total: int
                          ) -> tuple[BaseCommand, int]:
    """The command of a frame whose header said `total`, and the frame's
    size.  Raises ProtocolError on a malformed body."""
    try:
        body = await reader.readexactly(total)
    except asyncio.IncompleteReadError:
        raise ProtocolError("truncated frame") from None
    (cmd_size,) = _U32.unpack_from(body, 0)
    if cmd_size > total - 4:
        raise ProtocolError(f"command size {cmd_size} exceeds frame size {total}")
    cmd = BaseCommand()
    try:
        # A view, not a slice: no third copy of a large frame.
        cmd.ParseFromString(memoryview(body)[4:4 + cmd_size])
    except DecodeError as exc:
        raise ProtocolError(f"undecodable command: {exc}") from None
    del body
    if not cmd.IsInitialized():
        raise ProtocolError("command lacks required fields: "
                            + ", ".join(cmd.FindInitializationErrors()))
    return cmd, total + 4


async def read_command(reader: asyncio.StreamReader, max_frame: int = DEFAULT_MAX_FRAME
                       ) -> tuple[Optional[BaseCommand], int]:
    """Next command and its frame size; (None, 0) at a clean end of stream.
    Raises ProtocolError on a malformed frame."""
    total = await read_frame_header(reader, max_frame)
    if total is None:
        return None, 0
    return await read_frame_body(reader, total)


# ---- topic names ---------------------------------------------------------------

_TOPIC_RE = re.compile(r"^(persistent|non-persistent)://([^/]+)/([^/]+)/(.+)$")


def split_topic(name: str) -> tuple[str, str, str]:
    """(domain, namespace "tenant/ns", local name); ValueError if malformed."""
    m = _TOPIC_RE.match(name)
    if not m:
        raise ValueError(f"invalid topic name {name!r} "
                         "(expected persistent://tenant/namespace/topic)")
    return m[1], f"{m[2]}/{m[3]}", m[4]


def unencodable_at(name: str) -> Optional[int]:
    """Where `name` holds a character UTF-8 cannot encode (an unpaired
    surrogate, which JSON's "\\ud800" escapes make), None if nowhere.  Such
    a name cannot go into a frame (protobuf strings are UTF-8) nor be
    hashed or estimated.  Cheap for ASCII names, which most are."""
    if name.isascii():
        return None
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def mode_matches(name: str, mode: int) -> bool:
    """Whether a topic belongs to a GET_TOPICS_OF_NAMESPACE mode."""
    if mode == Mode.ALL:
        return True
    persistent = name.startswith("persistent://")
    return persistent if mode == Mode.PERSISTENT else not persistent


def topics_hash(topics: Iterable[str]) -> str:
    """Pulsar's TopicList.calculateHash: CRC32C of the names sorted as Java
    sorts strings (by UTF-16 code unit), UTF-8 encoded and joined by ",",
    printed as Guava's HashCode.toString prints an int hash: its four bytes
    little-endian first, in lower-case hex ("123456789" -> "839206e3")."""
    names = sorted(topics)
    joined = ",".join(names)
    if not joined.isascii():
        # Code point order differs from UTF-16 order only for characters
        # above U+FFFF against U+E000..U+FFFF; sort as Java does.
        names.sort(key=lambda t: t.encode("utf-16-be", "surrogatepass"))
        joined = ",".join(names)
    crc = google_crc32c.value(joined.encode("utf-8", "surrogatepass"))
    return crc.to_bytes(4, "little").hex()


def estimate_heap(topics: Iterable[str]) -> int:
    """PIP-442's heap estimate of a list: UTF-8 bytes + 32 per topic."""
    return sum(len(t.encode()) + TOPIC_OVERHEAD for t in topics)


def strip_domain_pattern(pattern: str) -> str:
    """Pulsar's TopicList.removeTopicDomainScheme: clients send patterns like
    'persistent://public/default/a.*', and the scheme is removed before
    matching, keeping what stands before it ('^persistent://x' -> '^x').
    ValueError for a scheme other than persistent or non-persistent."""
    prefix, sep, rest = pattern.partition("://")
    if not sep:
        return pattern
    for domain in ("non-persistent", "persistent"):
        if prefix.endswith(domain):
            return prefix[:-len(domain)] + rest
    raise ValueError(f"Does not support topic domain: {prefix}")


def strip_domain(topic: str) -> str:
    """A topic name without its scheme, as patterns are matched against."""
    return topic.partition("://")[2]


# ---- commands ------------------------------------------------------------------


def cmd(type_: int, field: Optional[str] = None, **values) -> BaseCommand:
    """A BaseCommand of a type with its body's fields set from keywords."""
    command = BaseCommand(type=type_)
    if field is not None:
        sub = getattr(command, field)
        sub.SetInParent()
        for k, v in values.items():
            if isinstance(v, (list, tuple)):
                getattr(sub, k).extend(v)
            elif isinstance(v, dict):
                getattr(sub, k).SetInParent()
                for kk, vv in v.items():
                    setattr(getattr(sub, k), kk, vv)
            else:
                setattr(sub, k, v)
    return command


def request_id_of(command: BaseCommand) -> int:
    """The request id of a command that has one, else 0: every command's
    body is the BaseCommand field numbered as its type, and the requests
    this service does not serve are declared with their request_id."""
    field = BaseCommand.DESCRIPTOR.fields_by_number.get(command.type)
    if field is None or field.message_type is None or not command.HasField(field.name):
        return 0
    body = getattr(command, field.name)
    return body.request_id if "request_id" in body.DESCRIPTOR.fields_by_name else 0


def has_body(command: BaseCommand) -> bool:
    """Whether a command carries its body (CommandXxx), where its type has
    one; a GET_TOPICS_OF_NAMESPACE without it is not a request."""
    field = BaseCommand.DESCRIPTOR.fields_by_number.get(command.type)
    if field is None or field.message_type is None:
        return True
    return command.HasField(field.name) or not field.message_type.fields


def error(request_id: int, code: int, message: str) -> BaseCommand:
    """An ERROR command answering request_id (the message cut to
    MAX_ERROR_MESSAGE characters)."""
    if len(message) > MAX_ERROR_MESSAGE:
        message = message[:MAX_ERROR_MESSAGE - 3] + "..."
    return cmd(CommandType.ERROR, "error", request_id=request_id, error=code, message=message)


def connected(watchers: bool, max_message_size: int) -> BaseCommand:
    """The CONNECTED answer, advertising watchers and maxMessageSize."""
    return cmd(CommandType.CONNECTED, "connected", server_version=SERVER_VERSION,
               protocol_version=PROTOCOL_VERSION, max_message_size=max_message_size,
               feature_flags={"supports_topic_watchers": watchers})


class RequestError(Exception):
    """An ERROR (or failed lookup) answer to a request."""

    def __init__(self, code: int, message: str):
        super().__init__(f"{ServerError.Name(code)}: {message}")
        self.code = code
        self.server_message = message


# ---- client connection ---------------------------------------------------------

_RESPONSE_FIELD = {
    CommandType.SUCCESS: "success",
    CommandType.ERROR: "error",
    CommandType.LOOKUP_RESPONSE: "lookupTopicResponse",
    CommandType.PARTITIONED_METADATA_RESPONSE: "partitionMetadataResponse",
    CommandType.GET_TOPICS_OF_NAMESPACE_RESPONSE: "getTopicsOfNamespaceResponse",
    CommandType.WATCH_TOPIC_LIST_SUCCESS: "watchTopicListSuccess",
}


class ClientConnection:
    """One connection to a broker or proxy: CONNECT handshake, requests
    matched to responses by request id, PINGs answered, watch updates queued.
    Used by the proxy (to the broker), the load generator and the tests."""

    def __init__(self, reader, writer, max_frame: int = DEFAULT_MAX_FRAME):
        self.reader, self.writer = reader, writer
        self.max_frame = max_frame
        self.pending: dict[int, asyncio.Future] = {}
        self.updates: asyncio.Queue = asyncio.Queue()
        self.ids = itertools.count(1)
        self.connected: Optional[pb.CommandConnected] = None
        self._reader_task: Optional[asyncio.Task] = None
        self.closed = asyncio.Event()

    @classmethod
    async def open(cls, url: str, *, max_frame: Optional[int] = None,
                   timeout: float = 10.0, proxy_to_broker_url: Optional[str] = None
                   ) -> "ClientConnection":
        """Connect and handshake.  Frames larger than max_frame close the
        connection; by default the limit is the one the server advertises
        (its maxMessageSize plus padding), as Pulsar's clients do."""
        host, port = parse_url(url)
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        self = cls(reader, writer, max_frame or DEFAULT_MAX_FRAME)
        connect = cmd(CommandType.CONNECT, "connect", client_version="pylimiter-client",
                      protocol_version=PROTOCOL_VERSION,
                      feature_flags={"supports_topic_watchers": True})
        if proxy_to_broker_url:
            connect.connect.proxy_to_broker_url = proxy_to_broker_url
        writer.write(encode(connect))
        first, _ = await asyncio.wait_for(read_command(reader, self.max_frame), timeout)
        if first is None or first.type != CommandType.CONNECTED:
            writer.close()
            raise ProtocolError(f"expected CONNECTED, got {first and CommandType.Name(first.type)}")
        self.connected = first.connected
        if max_frame is None and first.connected.HasField("max_message_size"):
            self.max_frame = max_frame_for(first.connected.max_message_size)
        self._reader_task = asyncio.ensure_future(self._read_loop())
        return self

    async def _read_loop(self):
        try:
            while True:
                command, size = await read_command(self.reader, self.max_frame)
                if command is None:
                    break
                if command.type == CommandType.PING:
                    self.writer.write(encode(cmd(CommandType.PONG, "pong")))
                    continue
                if command.type == CommandType.WATCH_TOPIC_UPDATE:
                    self.updates.put_nowait(command.watchTopicUpdate)
                    continue
                field = _RESPONSE_FIELD.get(command.type)
                if field is None:
                    continue
                rid = getattr(command, field).request_id
                fut = self.pending.pop(rid, None)
                if fut is not None and not fut.done():
                    fut.set_result((command, size))
        except (ProtocolError, ConnectionError, OSError) as exc:
            err = exc
        else:
            err = ConnectionError("connection closed by peer")
        finally:
            self.closed.set()
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(err)
        self.pending.clear()

    async def request(self, command: BaseCommand, request_id: int, timeout: Optional[float] = 30.0
                      ) -> tuple[BaseCommand, int]:
        """Send and await the response with the same request id; ERROR
        answers raise RequestError."""
        if self.closed.is_set():
            raise ConnectionError("connection is closed")
        fut = asyncio.get_running_loop().create_future()
        self.pending[request_id] = fut
        self.writer.write(encode(command))
        try:
            resp, size = await asyncio.wait_for(fut, timeout)
        finally:
            self.pending.pop(request_id, None)
        if resp.type == CommandType.ERROR:
            raise RequestError(resp.error.error, resp.error.message)
        return resp, size

    async def get_topics(self, namespace: str, mode: int = Mode.PERSISTENT,
                         pattern: Optional[str] = None, topics_hash: Optional[str] = None,
                         timeout: Optional[float] = 60.0):
        """GET_TOPICS_OF_NAMESPACE: (response body, frame size)."""
        rid = next(self.ids)
        command = cmd(CommandType.GET_TOPICS_OF_NAMESPACE, "getTopicsOfNamespace", request_id=rid,
                namespace=namespace, mode=mode)
        if pattern is not None:
            command.getTopicsOfNamespace.topics_pattern = pattern
        if topics_hash is not None:
            command.getTopicsOfNamespace.topics_hash = topics_hash
        resp, size = await self.request(command, rid, timeout)
        return resp.getTopicsOfNamespaceResponse, size

    async def watch(self, namespace: str, pattern: str, watcher_id: int,
                    topics_hash: Optional[str] = None, timeout: Optional[float] = 60.0):
        """WATCH_TOPIC_LIST: the success body; updates go to .updates."""
        rid = next(self.ids)
        command = cmd(CommandType.WATCH_TOPIC_LIST, "watchTopicList", request_id=rid,
                      watcher_id=watcher_id, namespace=namespace, topics_pattern=pattern)
        if topics_hash is not None:
            command.watchTopicList.topics_hash = topics_hash
        resp, _ = await self.request(command, rid, timeout)
        return resp.watchTopicListSuccess

    async def close_watch(self, watcher_id: int):
        """WATCH_TOPIC_LIST_CLOSE, awaiting its SUCCESS."""
        rid = next(self.ids)
        await self.request(cmd(CommandType.WATCH_TOPIC_LIST_CLOSE, "watchTopicListClose",
                               request_id=rid, watcher_id=watcher_id), rid)

    def send(self, command: BaseCommand) -> None:
        """Write a command without waiting for an answer."""
        self.writer.write(encode(command))

    async def close(self):
        """Close the connection and end its reader."""
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass
        if self._reader_task is not None:
            await asyncio.gather(self._reader_task, return_exceptions=True)


def parse_url(url: str) -> tuple[str, int]:
    """(host, port) of pulsar://host:port; ValueError otherwise."""
    m = re.match(r"^pulsar://([^:/]+|\[[^\]]+\]):(\d+)/?$", url)
    if not m:
        raise ValueError(f"expected pulsar://host:port, got {url!r}")
    return m[1].strip("[]"), int(m[2])
