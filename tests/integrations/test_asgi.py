"""pylimiter.asgi.MemoryLimitMiddleware, driven in-process: the scope,
receive and send of one or more requests fed by hand, against both
implementations (`mod`).  The real-server tests are in test_servers.py."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from pylimiter.asgi import MemoryLimitMiddleware
from tests._helpers import run

from . import need
from .asgi_kit import Client, EchoApp, http_scope, settle

MiB = 1 << 20


def mw_of(app, limiter, **kw):
    return MemoryLimitMiddleware(app, limiter, **kw)


async def start(mw, scope, client):
    task = asyncio.ensure_future(mw(scope, client.receive, client.send))
    await settle()
    return task


# ---- the declared length --------------------------------------------------

def test_declared_length_is_held_before_the_body_and_back_after_the_last_send(mod):
    sem = mod.AsyncSemaphore(100)
    app = EchoApp(sem)

    async def main():
        mw = mw_of(app, sem)
        c = Client()
        c.send_gate = asyncio.Event()
        t = await start(mw, http_scope(length=40), c)
        # The app runs before any body byte arrived, and holds 40 already;
        # the one receive() so far is the app's own.
        assert app.held_at_start == [40] and c.receives == 1 and app.first_messages == []
        c.feed(b"x" * 40)
        await c.sending.wait()
        await settle()
        assert sem.acquired_permits == 40      # the reply is still being written
        c.send_gate.set()
        await t
        assert c.status == 200 and c.body == b"40"
        assert sem.acquired_permits == 0

    run(main())


def test_the_app_gets_the_clients_messages_unchanged(mod):
    sem = mod.AsyncSemaphore(100)
    got = []

    async def app(scope, receive, send):
        got.append(await receive())
        await send({"type": "http.response.start", "status": 204})
        await send({"type": "http.response.body"})

    async def main():
        c = Client()
        msg = {"type": "http.request", "body": b"abc", "more_body": False, "extra": 1}
        c.inbox.put_nowait(msg)
        await mw_of(app, sem)(http_scope(length=3), c.receive, c.send)
        assert got == [msg] and got[0] is msg

    run(main())


def test_permits_are_back_before_a_background_task_ends(mod):
    sem = mod.AsyncSemaphore(100)
    during_background = []

    async def app(scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": 200})
        await send({"type": "http.response.body", "body": b"ok"})
        # Starlette runs a response's background task here, inside the app.
        during_background.append(sem.acquired_permits)

    async def main():
        c = Client()
        c.feed(b"x" * 10)
        await mw_of(app, sem)(http_scope(length=10), c.receive, c.send)

    run(main())
    assert during_background == [0]


def test_no_body_takes_no_permits(mod):
    sem = mod.AsyncSemaphore(5)
    app = EchoApp(sem)

    async def main():
        mw = mw_of(app, sem)
        held = sem.try_acquire(5)
        for scope in (http_scope("GET"), http_scope(length=0)):
            c = Client()
            c.feed()
            await mw(scope, c.receive, c.send)   # full limiter: still served
            assert c.status == 200
        sem.release(held)

    run(main())
    assert app.held_at_start == [5, 5]


def test_requests_queue_fifo_and_run_when_bytes_come_back(mod):
    sem = mod.AsyncSemaphore(10)
    order = []

    async def app(scope, receive, send):
        order.append(scope["path"])
        await receive()
        await send({"type": "http.response.start", "status": 200})
        await send({"type": "http.response.body", "body": b""})

    async def main():
        mw = mw_of(app, sem)
        first = sem.try_acquire(10)
        tasks = []
        for i, n in enumerate((6, 3, 1)):
            c = Client()
            c.feed(b"x" * n)
            tasks.append(await start(mw, http_scope(length=n, path=f"/{i}"), c))
        assert order == [] and sem.queue_size == 3
        sem.release(first)
        await asyncio.gather(*tasks)
        assert sem.acquired_permits == 0

    run(main())
    assert order == ["/0", "/1", "/2"]


# ---- 503 and 413 -------------------------------------------------------------

@pytest.mark.parametrize("retry_after, header", [(0, b"0"), (1.0, b"1"), (1.2, b"2"),
                                                 (2.01, b"3"), (30, b"30")])
def test_timeout_is_503_with_retry_after_rounded_up_and_the_app_never_runs(
        mod, retry_after, header):
    sem = mod.AsyncSemaphore(10)
    app = EchoApp(sem)

    async def main():
        mw = mw_of(app, sem, timeout=0.05, retry_after=retry_after)
        held = sem.try_acquire(10)
        c = Client()
        await mw(http_scope(length=5), c.receive, c.send)
        sem.release(held)
        return c

    c = run(main())
    assert c.status == 503 and app.calls == 0
    assert c.headers[b"retry-after"] == header
    assert c.body.count(b"\n") == 1 and c.body.endswith(b"\n")
    assert sem.acquired_permits == 0 and sem.queue_size == 0


def test_timeout_none_is_the_limiters_own(mod):
    sem = mod.AsyncSemaphore(10, timeout=0.05)
    app = EchoApp(sem)

    async def main():
        held = sem.try_acquire(10)
        c = Client()
        await asyncio.wait_for(mw_of(app, sem)(http_scope(length=5), c.receive, c.send), 5)
        sem.release(held)
        return c

    assert run(main()).status == 503


def test_a_full_queue_is_503_at_once(mod):
    sem = mod.AsyncSemaphore(10, max_queue_size=1, timeout=60)
    app = EchoApp(sem)

    async def main():
        mw = mw_of(app, sem)
        held = sem.try_acquire(10)
        queued = await start(mw, http_scope(length=5), Client())
        assert sem.queue_size == 1
        c = Client()
        t = asyncio.ensure_future(mw(http_scope(length=5), c.receive, c.send))
        await settle()
        assert t.done()                            # no wait on the limiter
        queued.cancel()
        await asyncio.gather(queued, return_exceptions=True)
        sem.release(held)
        return c

    c = run(main())
    assert c.status == 503 and b"retry-after" in c.headers and app.calls == 0
    assert sem.stats().queue_full_total == 1 and sem.acquired_permits == 0


def test_a_closed_limiter_is_503(mod):
    sem = mod.AsyncSemaphore(10)
    sem.close()
    c = Client()
    run(mw_of(EchoApp(), sem)(http_scope(length=5), c.receive, c.send))
    assert c.status == 503


def test_a_declared_body_over_the_limit_is_413_at_once(mod):
    sem = mod.AsyncSemaphore(10, timeout=60)
    app = EchoApp(sem)

    async def main():
        held = sem.try_acquire(10)   # even with no room, nothing is waited for
        out = []
        for kw, n in (({}, 11), ({"max_body_size": 4}, 5)):
            c = Client()
            await asyncio.wait_for(mw_of(app, sem, **kw)(http_scope(length=n), c.receive,
                                                        c.send), 1)
            out.append(c)
        sem.release(held)
        return out

    for c in run(main()):
        assert c.status == 413 and c.body.endswith(b"\n") and b"retry-after" not in c.headers
    assert app.calls == 0 and sem.stats().acquired_total == 1


def test_oversize_alone_takes_the_whole_limit_and_runs_alone(mod):
    sem = mod.AsyncSemaphore(10)
    app = EchoApp(sem)

    async def main():
        mw = mw_of(app, sem, oversize="alone")
        small = sem.try_acquire(1)
        c = Client()
        c.feed(b"x" * 25)
        t = await start(mw, http_scope(length=25), c)
        assert app.calls == 0 and sem.queue_size == 1   # waits for the whole limit
        sem.release(small)
        await t
        return c

    c = run(main())
    assert c.status == 200 and c.body == b"25" and app.held_at_start == [10]
    assert sem.acquired_permits == 0


def test_oversize_alone_with_a_smaller_max_body_size_still_runs_alone(mod):
    sem = mod.AsyncSemaphore(10)
    app = EchoApp(sem)
    c = Client()
    c.feed(b"x" * 6)
    run(mw_of(app, sem, oversize="alone", max_body_size=5)(http_scope(length=6), c.receive,
                                                           c.send))
    assert c.status == 200 and app.held_at_start == [10]


def test_a_body_larger_than_the_limit_below_max_body_size_is_charged_the_limit(mod):
    sem = mod.AsyncSemaphore(10)
    app = EchoApp(sem)
    c = Client()
    c.feed(b"x" * 30)
    run(mw_of(app, sem, max_body_size=100)(http_scope(length=30), c.receive, c.send))
    assert c.status == 200 and app.held_at_start == [10]


def test_malformed_content_length_is_400(mod):
    sem = mod.AsyncSemaphore(10)
    for value in (b"abc", b"-1", b"1e3"):
        c = Client()
        scope = http_scope(headers=[(b"content-length", value)])
        run(mw_of(EchoApp(), sem)(scope, c.receive, c.send))
        assert c.status == 400
    c = Client()
    scope = http_scope(headers=[(b"content-length", b"3"), (b"content-length", b"4")])
    run(mw_of(EchoApp(), sem)(scope, c.receive, c.send))
    assert c.status == 400


def test_an_unbounded_limiter_has_no_size_limit(mod):
    sem = mod.AsyncSemaphore(0)
    app = EchoApp(sem)
    c = Client()
    c.feed(b"x" * 1000)
    run(mw_of(app, sem)(http_scope(length=1000), c.receive, c.send))
    assert c.status == 200 and app.held_at_start == [1000]


# ---- bodies of unknown length -----------------------------------------------

@pytest.mark.parametrize("scope", [http_scope(chunked=True),
                                   http_scope(http_version="2")], ids=["chunked", "http2"])
def test_a_chunked_body_grows_one_permit_chunk_by_chunk(mod, scope):
    sem = mod.AsyncSemaphore(100)
    seen = []

    async def app(scope, receive, send):
        while True:
            msg = await receive()
            seen.append((len(msg["body"]), sem.acquired_permits))
            if not msg["more_body"]:
                break
        await send({"type": "http.response.start", "status": 200})
        await send({"type": "http.response.body", "body": b"ok"})

    async def main():
        c = Client()
        for n in (10, 20, 5):
            c.feed(b"x" * n, more=True)
        c.feed(b"", more=False)
        await mw_of(app, sem)(scope, c.receive, c.send)
        return c

    assert run(main()).status == 200
    assert seen == [(10, 10), (20, 30), (5, 35), (0, 35)]
    # One permit: acquired once, grown twice (each growth is a grant).
    assert sem.acquired_permits == 0 and sem.stats().acquired_total == 3


def test_a_chunked_body_growing_past_the_limit_is_cut_with_413(mod):
    sem = mod.AsyncSemaphore(100)
    shown = []

    async def app(scope, receive, send):
        while True:
            msg = await receive()
            shown.append(msg["type"])
            if msg["type"] == "http.disconnect":
                raise OSError("client went away")   # as Starlette's ClientDisconnect
            if not msg["more_body"]:
                break
        await send({"type": "http.response.start", "status": 200})
        await send({"type": "http.response.body", "body": b"ok"})

    async def main():
        c = Client()
        c.feed(b"x" * 60, more=True)
        c.feed(b"x" * 60, more=True)
        await mw_of(app, sem)(http_scope(chunked=True), c.receive, c.send)
        return c

    c = run(main())
    assert c.status == 413 and c.headers[b"content-type"].startswith(b"text/plain")
    assert shown == ["http.request", "http.disconnect"]
    assert sem.acquired_permits == 0


def test_a_chunked_first_message_over_the_limit_is_413_before_the_app(mod):
    sem = mod.AsyncSemaphore(10)
    app = EchoApp(sem)
    c = Client()
    c.feed(b"x" * 11, more=True)
    run(mw_of(app, sem)(http_scope(chunked=True), c.receive, c.send))
    assert c.status == 413 and app.calls == 0


def test_a_chunk_with_no_room_is_cut_with_503(mod):
    sem = mod.AsyncSemaphore(100)
    app = EchoApp(sem)

    async def main():
        mw = mw_of(app, sem, timeout=0.05)
        c = Client()
        c.feed(b"x" * 10, more=True)
        t = await start(mw, http_scope(chunked=True), c)
        assert app.calls == 1 and sem.acquired_permits == 10
        other = sem.try_acquire(90)
        c.feed(b"x" * 10, more=False)     # needs 20 in all: no room
        await t
        sem.release(other)
        return c

    c = run(main())
    assert c.status == 503 and c.headers[b"retry-after"] == b"1"
    assert sem.acquired_permits == 0


def test_a_cut_after_the_response_started_aborts(mod):
    sem = mod.AsyncSemaphore(10)

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200})
        await send({"type": "http.response.body", "body": b"partial", "more_body": True})
        while (await receive())["type"] != "http.disconnect":
            pass
        await send({"type": "http.response.body", "body": b"end"})

    async def main():
        c = Client()
        c.feed(b"x" * 5, more=True)
        c.feed(b"x" * 6, more=True)
        with pytest.raises(RuntimeError, match="after the response had started"):
            await mw_of(app, sem)(http_scope(chunked=True), c.receive, c.send)
        return c

    c = run(main())
    assert c.status == 200 and c.body == b"partial"     # nothing after the cut
    assert sem.acquired_permits == 0


# ---- disconnects, timeouts, exceptions, cancellation -------------------------

def test_a_client_disconnecting_while_queued_leaves_the_queue_at_once(mod):
    sem = mod.AsyncSemaphore(10, timeout=60)
    app = EchoApp(sem)

    async def main():
        held = sem.try_acquire(10)
        c = Client()
        t = await start(mw_of(app, sem), http_scope(length=5), c)
        assert sem.queue_size == 1
        c.disconnect()
        await asyncio.wait_for(t, 1)
        assert sem.queue_size == 0 and c.sent == [] and app.calls == 0
        sem.release(held)

    run(main())
    assert sem.acquired_permits == 0 and sem.stats().cancelled_total == 1


def test_the_whole_body_pulled_while_queued_is_handed_on_and_a_disconnect_still_seen(mod):
    sem = mod.AsyncSemaphore(10, timeout=60)

    async def main():
        mw = mw_of(EchoApp(sem), sem)
        held = sem.try_acquire(10)
        # The whole body arrives while queued, then the client waits: served.
        c1 = Client()
        c1.feed(b"abcde")
        t1 = await start(mw, http_scope(length=5), c1)
        assert c1.receives == 2          # the body, then a wait for a disconnect
        # The same, but this client leaves: noticed while queued.
        c2 = Client()
        c2.feed(b"abcde")
        t2 = await start(mw, http_scope(length=5), c2)
        c2.disconnect()
        await asyncio.wait_for(t2, 1)
        assert c2.sent == [] and sem.queue_size == 1
        sem.release(held)
        await t1
        assert c1.status == 200 and c1.body == b"5"

    run(main())
    assert sem.acquired_permits == 0


def test_a_partial_body_is_pulled_once_and_the_request_waits_for_its_timeout(mod):
    # At most one body message is pulled while queued: after a partial one a
    # disconnect cannot be seen without buffering the body.
    sem = mod.AsyncSemaphore(10, timeout=60)

    async def main():
        held = sem.try_acquire(10)
        c = Client()
        c.feed(b"ab", more=True)
        c.disconnect()
        t = await start(mw_of(EchoApp(sem), sem, timeout=0.1), http_scope(length=5), c)
        assert c.receives == 1 and sem.queue_size == 1
        await asyncio.wait_for(t, 2)
        sem.release(held)
        return c

    c = run(main())
    assert c.status == 503 and sem.queue_size == 0 and sem.acquired_permits == 0


def test_a_disconnect_during_the_app_releases_at_once(mod):
    sem = mod.AsyncSemaphore(10)
    after_disconnect = []

    async def app(scope, receive, send):
        await receive()
        msg = await receive()
        assert msg["type"] == "http.disconnect"
        after_disconnect.append(sem.acquired_permits)

    async def main():
        c = Client()
        c.feed(b"x" * 5)
        c.disconnect()
        await mw_of(app, sem)(http_scope(length=5), c.receive, c.send)

    run(main())
    assert after_disconnect == [0] and sem.acquired_permits == 0


def test_an_app_exception_propagates_and_releases(mod):
    sem = mod.AsyncSemaphore(10)

    async def app(scope, receive, send):
        await receive()
        raise KeyError("boom")

    async def main():
        c = Client()
        c.feed(b"x" * 5)
        with pytest.raises(KeyError):
            await mw_of(app, sem)(http_scope(length=5), c.receive, c.send)

    run(main())
    assert sem.acquired_permits == 0


def test_cancelled_while_queued_or_in_the_app_leaks_nothing(mod):
    sem = mod.AsyncSemaphore(10, timeout=60)

    async def main():
        app = EchoApp(sem)
        app.hold = asyncio.Event()
        mw = mw_of(app, sem)
        c1 = Client()
        running = await start(mw, http_scope(length=8), c1)
        c2 = Client()
        queued = await start(mw, http_scope(length=8), c2)
        assert sem.acquired_permits == 8 and sem.queue_size == 1
        queued.cancel()
        running.cancel()
        await asyncio.gather(queued, running, return_exceptions=True)
        assert queued.cancelled() and running.cancelled()

    run(main())
    assert sem.acquired_permits == 0 and sem.queue_size == 0


EVENTS = ("grant", "disconnect", "timeout", "cancel")


@pytest.mark.parametrize("order", list(itertools.permutations(EVENTS, 3)),
                         ids=lambda o: "-".join(o))
def test_nothing_leaks_in_any_order_of_grant_disconnect_timeout_cancel(mod, order):
    """Three of the four events in each order, each let happen in the same
    loop pass as the one before it where that is possible (so that grants
    race disconnects and cancels); the books balance whatever happened."""
    sem = mod.AsyncSemaphore(10, timeout=60)

    async def main():
        app = EchoApp(sem)
        mw = mw_of(app, sem, timeout=0.03)
        held = sem.try_acquire(10)
        c = Client()
        t = await start(mw, http_scope(length=5), c)
        for event in order:
            if event == "grant" and held is not None:
                sem.release(held)
                held = None
            elif event == "disconnect":
                c.disconnect()
            elif event == "timeout":
                await asyncio.sleep(0.05)
            elif event == "cancel":
                t.cancel()
            await asyncio.sleep(0)
        c.feed(b"x" * 5)
        c.disconnect()
        await asyncio.gather(t, return_exceptions=True)
        if held is not None:
            sem.release(held)
        assert c.status in (None, 200, 503)
        await settle()

    run(main())
    assert sem.acquired_permits == 0 and sem.queue_size == 0


def test_many_requests_with_random_fates_leak_nothing(mod):
    import random

    rng = random.Random(7)
    sem = mod.AsyncSemaphore(50, max_queue_size=20, timeout=60)

    async def app(scope, receive, send):
        fate = scope["path"]
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            if not msg.get("more_body"):
                break
        await asyncio.sleep(rng.random() * 0.01)
        if fate == "/raise":
            raise ValueError("app failed")
        await send({"type": "http.response.start", "status": 200})
        await send({"type": "http.response.body", "body": b"ok"})

    async def one(mw):
        c = Client()
        fate = rng.choice(["/ok", "/raise", "/leave", "/cancel", "/chunked"])
        n = rng.randint(1, 30)
        scope = http_scope(chunked=True, path=fate) if fate == "/chunked" \
            else http_scope(length=n, path=fate)
        if fate == "/chunked":
            c.feed(b"x" * n, more=True)
            c.feed(b"x" * n)
        else:
            c.feed(b"x" * n)
        t = asyncio.ensure_future(mw(scope, c.receive, c.send))
        await asyncio.sleep(rng.random() * 0.01)
        if fate == "/leave":
            c.disconnect()
        elif fate == "/cancel":
            t.cancel()
        await asyncio.gather(t, return_exceptions=True)

    async def main():
        mw = mw_of(app, sem, timeout=0.02)
        await asyncio.gather(*(one(mw) for _ in range(300)))

    run(main())
    assert sem.acquired_permits == 0 and sem.queue_size == 0


# ---- other scopes ------------------------------------------------------------

@pytest.mark.parametrize("kind", ["websocket", "lifespan"])
def test_websocket_and_lifespan_pass_through(mod, kind):
    sem = mod.AsyncSemaphore(1)
    seen = []

    async def app(scope, receive, send):
        seen.append((scope, receive, send))

    async def receive():
        return {}

    async def send(msg):
        pass

    scope = {"type": kind, "headers": [(b"content-length", b"999")]}
    held = sem.try_acquire(1)
    run(mw_of(app, sem)(scope, receive, send))
    sem.release(held)
    assert seen == [(scope, receive, send)] and sem.stats().acquired_total == 1


# ---- per-key budgets ---------------------------------------------------------

def test_a_key_over_its_budget_waits_without_holding_global_permits(mod):
    glob = mod.AsyncSemaphore(100)
    tenants = {"a": mod.AsyncSemaphore(10), "b": mod.AsyncSemaphore(10)}

    async def main():
        app = EchoApp()
        app.hold = asyncio.Event()
        mw = mw_of(app, glob, key=lambda s: dict(s["headers"])[b"x-tenant"].decode(),
                   key_limiter=tenants.__getitem__)

        def req(tenant, n):
            c = Client()
            c.feed(b"x" * n)
            return http_scope(length=n, headers=[(b"x-tenant", tenant)]), c

        s1, c1 = req(b"a", 8)
        t1 = await start(mw, s1, c1)
        s2, c2 = req(b"a", 8)
        t2 = await start(mw, s2, c2)           # over tenant a's budget
        s3, c3 = req(b"b", 8)
        t3 = await start(mw, s3, c3)           # tenant b is not held up
        assert tenants["a"].acquired_permits == 8 and tenants["a"].queue_size == 1
        assert glob.acquired_permits == 16     # a's first and b's: not a's second
        assert app.calls == 2
        app.hold.set()
        await asyncio.gather(t1, t2, t3)
        assert [c.status for c in (c1, c2, c3)] == [200, 200, 200]

    run(main())
    assert glob.acquired_permits == 0
    assert all(t.acquired_permits == 0 for t in tenants.values())


def test_the_key_is_taken_first_and_the_global_wait_holds_it(mod):
    glob = mod.AsyncSemaphore(10, timeout=60)
    tenant = mod.AsyncSemaphore(10)

    async def main():
        mw = mw_of(EchoApp(), glob, key=lambda s: "t", key_limiter=lambda k: tenant,
                   timeout=0.1)
        held = glob.try_acquire(10)
        c = Client()
        t = await start(mw, http_scope(length=5), c)
        assert tenant.acquired_permits == 5 and glob.queue_size == 1
        await t                                # the global wait times out
        glob.release(held)
        return c

    assert run(main()).status == 503
    assert tenant.acquired_permits == 0 and glob.acquired_permits == 0


def test_a_key_of_none_has_no_per_key_limit(mod):
    glob = mod.AsyncSemaphore(10)
    called = []

    def key_limiter(k):
        called.append(k)
        return None if k == "free" else glob

    for key in (lambda s: None, lambda s: "free"):
        c = Client()
        c.feed(b"x")
        run(mw_of(EchoApp(), glob, key=key, key_limiter=key_limiter)(http_scope(length=1),
                                                                      c.receive, c.send))
        assert c.status == 200
    assert called == ["free"] and glob.stats().acquired_total == 2


def test_a_tenant_smaller_than_the_body_charges_its_whole_budget(mod):
    glob = mod.AsyncSemaphore(100)
    tenant = mod.AsyncSemaphore(10)
    app = EchoApp(tenant)
    c = Client()
    c.feed(b"x" * 50)
    run(mw_of(app, glob, key=lambda s: "t", key_limiter=lambda k: tenant)(
        http_scope(length=50), c.receive, c.send))
    assert c.status == 200 and app.held_at_start == [10]


# ---- responses ---------------------------------------------------------------

def test_response_bytes_are_held_from_each_body_message_until_sent(mod):
    sem = mod.AsyncSemaphore(100)
    out = mod.AsyncSemaphore(1000)

    async def app(scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": 200})
        await send({"type": "http.response.body", "body": b"x" * 300, "more_body": True})
        await send({"type": "http.response.body", "body": b"y" * 200})

    async def main():
        c = Client()
        c.feed(b"x" * 7)
        c.send_gate = asyncio.Event()
        t = await start(mw_of(app, sem, response_limiter=out), http_scope(length=7), c)
        # The start is kept back until the first body has its permits; both
        # go out together, and the first body's 300 are held while it is sent.
        assert c.sending.is_set() and out.acquired_permits == 300
        assert sem.acquired_permits == 7
        c.send_gate.set()
        await t
        return c

    c = run(main())
    assert c.status == 200 and c.body == b"x" * 300 + b"y" * 200
    assert out.acquired_permits == 0 and out.stats().acquired_total == 2
    assert sem.acquired_permits == 0


def test_a_dual_limiter_holds_request_bodies_in_heap_and_responses_in_direct(mod):
    dual = mod.AsyncDualMemoryLimiter(100, 1000)
    heap = dual.get_limiter(mod.LimitType.HEAP_MEMORY)
    direct = dual.get_limiter(mod.LimitType.DIRECT_MEMORY)
    seen = []

    async def app(scope, receive, send):
        await receive()
        seen.append((heap.acquired_permits, direct.acquired_permits))
        await send({"type": "http.response.start", "status": 200})
        await send({"type": "http.response.body", "body": b"z" * 123})

    async def main():
        c = Client()
        c.feed(b"x" * 40)

        async def watch_send(msg):
            if msg["type"] == "http.response.body":
                seen.append((heap.acquired_permits, direct.acquired_permits))
            await c.send(msg)

        await mw_of(app, dual)(http_scope(length=40), c.receive, watch_send)
        return c

    assert run(main()).status == 200
    assert seen == [(40, 0), (40, 123)]
    assert heap.acquired_permits == 0 and direct.acquired_permits == 0


def test_no_room_for_the_first_response_body_is_a_clean_503(mod):
    sem = mod.AsyncSemaphore(100)
    out = mod.AsyncSemaphore(10)

    async def app(scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": 200})
        await send({"type": "http.response.body", "body": b"x" * 5})

    async def main():
        held = out.try_acquire(10)
        c = Client()
        c.feed(b"x")
        await mw_of(app, sem, response_limiter=out, timeout=0.05)(http_scope(length=1),
                                                                   c.receive, c.send)
        out.release(held)
        return c

    c = run(main())
    assert c.status == 503 and [m["type"] for m in c.sent].count("http.response.start") == 1
    assert sem.acquired_permits == 0 and out.acquired_permits == 0


def test_no_room_for_a_later_response_body_raises_into_the_app(mod):
    sem = mod.AsyncSemaphore(100)
    out = mod.AsyncSemaphore(10)
    errors = []

    async def app(scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": 200})
        await send({"type": "http.response.body", "body": b"x" * 5, "more_body": True})
        held.append(out.try_acquire(10))
        try:
            await send({"type": "http.response.body", "body": b"x" * 5})
        except Exception as exc:
            errors.append(type(exc).__name__)
            raise

    held = []

    async def main():
        c = Client()
        c.feed(b"x")
        with pytest.raises(mod.PermitAcquireTimeoutError if hasattr(
                mod, "PermitAcquireTimeoutError") else Exception):
            await mw_of(app, sem, response_limiter=out, timeout=0.05)(
                http_scope(length=1), c.receive, c.send)

    run(main())
    assert errors == ["PermitAcquireTimeoutError"]
    out.release(held[0])
    assert sem.acquired_permits == 0 and out.acquired_permits == 0


# ---- the limiter protocol, duck-typed ----------------------------------------

class Wrapped:
    """A semaphore that is not an AsyncSemaphore (as SharedSemaphore is
    not): the middleware needs only the protocol."""

    def __init__(self, sem):
        self._sem = sem
        self.calls = []

    @property
    def max_permits(self):
        return self._sem.max_permits

    def try_acquire(self, n):
        self.calls.append("try_acquire")
        return self._sem.try_acquire(n)

    def acquire(self, n, **kw):
        self.calls.append("acquire")
        return self._sem.acquire(n, **kw)

    def update(self, permit, n, **kw):
        self.calls.append("update")
        return self._sem.update(permit, n, **kw)

    def release(self, permit):
        self.calls.append("release")
        self._sem.release(permit)


def test_any_object_with_the_semaphore_protocol_works(mod):
    sem = mod.AsyncSemaphore(10)
    w = Wrapped(sem)

    async def main():
        mw = mw_of(EchoApp(), w)
        held = sem.try_acquire(8)
        c = Client()
        c.feed(b"x" * 5)
        t = await start(mw, http_scope(length=5), c)
        sem.release(held)
        await t
        c = Client()
        c.feed(b"x" * 2, more=True)
        c.feed(b"x" * 2)
        await mw(http_scope(chunked=True), c.receive, c.send)

    run(main())
    assert w.calls == ["try_acquire", "acquire", "release",
                       "try_acquire", "update", "release"]
    assert sem.acquired_permits == 0


# ---- arguments ----------------------------------------------------------------

def test_bad_arguments_are_clear_errors(mod):
    sem = mod.AsyncSemaphore(10)
    app = EchoApp()
    cases = [
        (TypeError, "limiter must be a semaphore", dict(limiter=object())),
        (TypeError, "response_limiter must be", dict(limiter=sem, response_limiter=3)),
        (ValueError, "oversize must be 'reject' or 'alone'", dict(limiter=sem, oversize="drop")),
        (ValueError, "max_body_size must be >= 0", dict(limiter=sem, max_body_size=-1)),
        (TypeError, "max_body_size must be an int", dict(limiter=sem, max_body_size=1.5)),
        (ValueError, "retry_after must be a finite", dict(limiter=sem, retry_after=float("nan"))),
        (ValueError, "timeout must be >= 0", dict(limiter=sem, timeout=-1)),
        (ValueError, "key and key_limiter go together", dict(limiter=sem, key=lambda s: "k")),
        (TypeError, "key_limiter must be callable", dict(limiter=sem, key=lambda s: "k",
                                                         key_limiter={"k": sem})),
    ]
    for exc, text, kw in cases:
        with pytest.raises(exc, match=text) as info:
            MemoryLimitMiddleware(app, **kw)
        assert str(info.value).startswith("pylimiter: ")


def test_starlette_and_fastapi_add_middleware(mod):
    httpx = need("httpx")
    fastapi = need("fastapi")
    from starlette.applications import Starlette
    from starlette.background import BackgroundTask
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    sem = mod.AsyncSemaphore(1000)
    during = []

    async def upload(request):
        body = await request.body()
        during.append(sem.acquired_permits)
        return PlainTextResponse(str(len(body)),
                                 background=BackgroundTask(lambda: during.append(
                                     sem.acquired_permits)))

    star = Starlette(routes=[Route("/up", upload, methods=["POST"])])
    star.add_middleware(MemoryLimitMiddleware, limiter=sem)
    fast = fastapi.FastAPI()
    fast.add_api_route("/up", upload_endpoint(upload, fastapi.Request), methods=["POST"])
    fast.add_middleware(MemoryLimitMiddleware, limiter=sem, max_body_size=500)

    async def main():
        out = []
        for app in (star, fast):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app),
                                         base_url="http://t") as client:
                out.append((await client.post("/up", content=b"x" * 321)).text)
                out.append((await client.post("/up", content=b"x" * 600)).status_code)
        return out

    assert run(main()) == ["321", 200, "321", 413]
    assert during == [321, 0, 600, 0, 321, 0]


def upload_endpoint(upload, request_type):
    """A FastAPI endpoint taking the Request (its annotation must be the
    class itself: this module's annotations are strings)."""
    async def endpoint(request):
        return await upload(request)

    endpoint.__annotations__ = {"request": request_type}
    return endpoint


@pytest.mark.parametrize("path", ["granted at once", "general"])
def test_with_trailers_the_permit_is_back_after_the_last_trailers(mod, path):
    sem = mod.AsyncSemaphore(100)
    seen = []

    async def app(scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": 200, "trailers": True})
        await send({"type": "http.response.body", "body": b"ok"})
        seen.append(sem.acquired_permits)
        await send({"type": "http.response.trailers", "headers": [], "more_trailers": False})
        seen.append(sem.acquired_permits)

    kw = {} if path == "granted at once" else {"response_limiter": mod.AsyncSemaphore(100)}
    c = Client()
    c.feed(b"x" * 9)
    run(mw_of(app, sem, **kw)(http_scope(length=9), c.receive, c.send))
    assert seen == [9, 0]
