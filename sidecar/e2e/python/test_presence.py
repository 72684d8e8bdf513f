"""Presence with supabase-py's realtime client: two clients track, each sees both in its
synced state; one untracks and the other sees it leave."""

import uuid

from conftest import connected, subscribed, wait_for


def presence_channel(client, topic, key, syncs):
    """A channel whose presence key is `key`; every sync appends a snapshot of its state."""
    channel = client.channel(topic, {"config": {"broadcast": {"ack": False, "self": False},
                                                "presence": {"key": key, "enabled": True}, "private": False}})
    return channel.on_presence_sync(lambda: syncs.append(members(channel)))


def members(channel):
    """The synced state as {key: [meta without presence_ref, ...]}."""
    return {k: [{f: v for f, v in m.items() if f != "presence_ref"} for m in metas]
            for k, metas in channel.presence_state().items()}


async def test_track_untrack_and_sync_across_two_clients(sidecar):
    topic = f"py-lobby-{uuid.uuid4()}"
    async with connected(sidecar) as one, connected(sidecar) as two:
        syncs_a, syncs_b = [], []
        a = presence_channel(one, topic, "alice", syncs_a)
        b = presence_channel(two, topic, "bob", syncs_b)
        await subscribed(a)
        await subscribed(b)
        both = {"alice": [{"status": "online"}], "bob": [{"status": "away"}]}
        await a.track({"status": "online"})
        await b.track({"status": "away"})
        await wait_for(lambda: members(a) == both and members(b) == both, "both clients see both members")
        await b.untrack()
        await wait_for(lambda: members(a) == {"alice": [{"status": "online"}]}, "alice sees bob leave")
        await wait_for(lambda: members(b) == {"alice": [{"status": "online"}]}, "bob sees himself leave")
        # Each change reached the app through its sync callback, never a member listed twice.
        assert both in syncs_a and both in syncs_b
        assert syncs_a[-1] == {"alice": [{"status": "online"}]}
        # Bob tracks again, with a new meta: both see him back, listed once.
        await b.track({"status": "back"})
        again = {"alice": [{"status": "online"}], "bob": [{"status": "back"}]}
        await wait_for(lambda: members(a) == again and members(b) == again, "both see bob back with his new meta")
