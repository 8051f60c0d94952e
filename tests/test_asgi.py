"""The ASGI replay the middlewares share: what a middleware read reaches the app once, then the
connection's own messages (a later disconnect included)."""

import asyncio

from growpage.asgi import body_message, replay_first


def test_the_app_gets_the_read_body_once_then_the_connection():
    later = [{"type": "http.disconnect"}]

    async def receive():
        return later.pop()

    async def app_reads():
        replayed = replay_first(body_message(b'{"prompt": "hi"}'), receive)
        return [await replayed(), await replayed()]

    first, second = asyncio.run(app_reads())
    assert first == {"type": "http.request", "body": b'{"prompt": "hi"}', "more_body": False}
    assert second == {"type": "http.disconnect"} and later == []


def test_a_disconnect_that_interrupted_the_read_is_what_the_app_sees_first():
    async def receive():
        raise AssertionError("the app should not need the connection yet")

    async def app_reads():
        return await replay_first({"type": "http.disconnect"}, receive)()

    assert asyncio.run(app_reads()) == {"type": "http.disconnect"}
