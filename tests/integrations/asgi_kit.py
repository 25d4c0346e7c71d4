"""An ASGI server in miniature for the middleware's unit tests: a scope, a
client whose messages the test feeds one by one, and the messages the app
sent back, all driven in-process on one event loop."""

from __future__ import annotations

import asyncio


def http_scope(method="POST", length=None, chunked=False, headers=(), http_version="1.1",
               path="/"):
    h = list(headers)
    if length is not None:
        h.append((b"content-length", str(length).encode()))
    if chunked:
        h.append((b"transfer-encoding", b"chunked"))
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": http_version,
            "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
            "query_string": b"", "headers": h, "client": ("127.0.0.1", 5000),
            "server": ("127.0.0.1", 8000)}


class Client:
    """The server side of one request, as uvicorn behaves: receive() hands
    out what the test fed, in order, and waits when nothing is there; every
    message sent is kept; `send_gate`, when set, holds each send until the
    test opens it (a slow socket)."""

    def __init__(self):
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.sent: list[dict] = []
        self.receives = 0
        self.send_gate: asyncio.Event | None = None
        self.sending = asyncio.Event()

    def feed(self, body=b"", more=False):
        self.inbox.put_nowait({"type": "http.request", "body": body, "more_body": more})

    def disconnect(self):
        self.inbox.put_nowait({"type": "http.disconnect"})

    async def receive(self):
        self.receives += 1
        return await self.inbox.get()

    async def send(self, msg):
        self.sending.set()
        if self.send_gate is not None:
            await self.send_gate.wait()
        self.sent.append(msg)

    @property
    def status(self):
        for m in self.sent:
            if m["type"] == "http.response.start":
                return m["status"]
        return None

    @property
    def headers(self):
        for m in self.sent:
            if m["type"] == "http.response.start":
                return dict(m.get("headers", []))
        return None

    @property
    def body(self):
        return b"".join(m.get("body", b"") for m in self.sent
                        if m["type"] == "http.response.body")


class EchoApp:
    """Reads the whole body, answers 200 with its length.  Records what the
    limiter held when it started, and can be held at a gate before reading
    (`hold`) or before answering (`hold_reply`)."""

    def __init__(self, sem=None):
        self.sem = sem
        self.calls = 0
        self.held_at_start: list[int] = []
        self.first_messages: list[dict] = []
        self.hold: asyncio.Event | None = None
        self.hold_reply: asyncio.Event | None = None
        self.started = asyncio.Event()
        self.finished = 0

    async def __call__(self, scope, receive, send):
        self.calls += 1
        if self.sem is not None:
            self.held_at_start.append(self.sem.acquired_permits)
        self.started.set()
        if self.hold is not None:
            await self.hold.wait()
        size = 0
        while True:
            msg = await receive()
            if not self.first_messages or len(self.first_messages) < self.calls:
                self.first_messages.append(msg)
            if msg["type"] == "http.disconnect":
                return
            size += len(msg.get("body", b""))
            if not msg.get("more_body", False):
                break
        if self.hold_reply is not None:
            await self.hold_reply.wait()
        reply = str(size).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(reply)).encode())]})
        await send({"type": "http.response.body", "body": reply})
        self.finished += 1


async def settle(n=10):
    for _ in range(n):
        await asyncio.sleep(0)
