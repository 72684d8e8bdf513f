"""Broadcast with supabase-py's realtime client: public and private channels, sent with ack
(`channel.push`, whose reply the client hands to `receive`) and received by another client."""

import asyncio
import uuid

from conftest import connected, load_private_policies, subscribed, user_token, wait_for
from realtime import ChannelEvents, RealtimeAcknowledgementStatus


async def send_acked(channel, event, payload, with_reply=False, seconds=10):
    """Sends a broadcast and returns the server's answer: "ok", "error" or "timeout" (and
    the reply's body `with_reply`)."""
    push = await channel.push(ChannelEvents.broadcast, {"type": "broadcast", "event": event, "payload": payload})
    answer = asyncio.get_running_loop().create_future()

    def settle(status):
        return lambda *reply: answer.done() or answer.set_result((status.value, reply[0] if reply else None))

    for status in RealtimeAcknowledgementStatus:
        push.receive(status, settle(status))
    status, reply = await asyncio.wait_for(answer, seconds)
    return (status, reply) if with_reply else status


def config(private=False, self_=False):
    return {"config": {"broadcast": {"ack": True, "self": self_}, "private": private}}


async def test_public_broadcast_both_ways_with_ack(sidecar):
    topic = f"py-chat-{uuid.uuid4()}"
    async with connected(sidecar) as alice, connected(sidecar) as bob:
        at_alice, at_bob = [], []
        a = alice.channel(topic, config(self_=True)).on_broadcast("*", at_alice.append)
        b = bob.channel(topic, config()).on_broadcast("*", at_bob.append)
        await subscribed(a)
        await subscribed(b)
        assert await send_acked(a, "ping", {"n": 1}) == "ok"
        await wait_for(lambda: at_bob, "bob receives alice's ping")
        assert [(m["event"], m["payload"]) for m in at_bob] == [("ping", {"n": 1})]
        assert await send_acked(b, "pong", {"n": 2}) == "ok"
        await wait_for(lambda: len(at_alice) == 2, "alice receives her own ping (self) and bob's pong")
        assert [(m["event"], m["payload"]) for m in at_alice] == [("ping", {"n": 1}), ("pong", {"n": 2})]
        # Bob's channel has no `self`: his own pong never came back to him, and it would have
        # arrived before alice's copy did (one topic, one order).
        assert [m["event"] for m in at_bob] == ["ping"]


async def test_private_broadcast_with_ack_follows_the_policies(sidecar, db):
    room = f"room:py-{uuid.uuid4()}"
    writer, reader = str(uuid.uuid4()), str(uuid.uuid4())
    load_private_policies(db)
    db.execute("INSERT INTO private_members VALUES (%s, %s, true), (%s, %s, false)", (writer, room, reader, room))
    async with connected(sidecar, user_token(writer)) as w, connected(sidecar, user_token(reader)) as r:
        at_reader = []
        wc = w.channel(room, config(private=True))
        rc = r.channel(room, config(private=True)).on_broadcast("secret", at_reader.append)
        await subscribed(wc)
        await subscribed(rc)
        assert await send_acked(wc, "secret", {"s": 1}) == "ok"
        await wait_for(lambda: at_reader, "the reader receives the writer's private broadcast")
        assert [m["payload"] for m in at_reader] == [{"s": 1}]
        # The reader may read but not write: its send is refused, and the ack says so.
        status, reply = await send_acked(rc, "secret", {"s": 2}, with_reply=True)
        assert status == "error", reply
        assert "permissions to write to this Channel topic" in str(reply), reply


async def test_a_stranger_cannot_join_a_private_channel(sidecar, db):
    room = f"room:py-{uuid.uuid4()}"
    load_private_policies(db)
    async with connected(sidecar, user_token(str(uuid.uuid4()))) as stranger:
        states = []
        channel = stranger.channel(room, config(private=True))
        await asyncio.wait_for(channel.subscribe(lambda state, err: states.append((state, str(err)))), 10)
        assert [s for s, _ in states] == ["CHANNEL_ERROR"], states
        assert "Unauthorized" in states[0][1], states
