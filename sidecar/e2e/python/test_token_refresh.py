"""A token refresh with supabase-py's realtime client (`set_auth`): a private channel joined
with a token about to expire stays open past that expiry once a fresh token was sent, and
keeps receiving; the same channel on a client that did not refresh is closed at expiry."""

import time
import uuid

from conftest import connected, load_private_policies, subscribed, user_token, wait_for
from realtime import ChannelStates

SHORT = 3  # seconds the first token lives


async def test_set_auth_keeps_a_private_channel_open_past_the_first_tokens_expiry(sidecar, db):
    room = f"room:py-refresh-{uuid.uuid4()}"
    member = str(uuid.uuid4())
    load_private_policies(db)
    db.execute("INSERT INTO private_members VALUES (%s, %s, false)", (member, room))
    short = user_token(member, seconds=SHORT)
    expires = time.time() + SHORT
    private = {"config": {"broadcast": {"ack": False, "self": False}, "private": True}}
    async with connected(sidecar, short) as refreshed, connected(sidecar, short) as stale:
        got, kept_states, lost_states = [], [], []
        kept = refreshed.channel(room, private).on_broadcast("tick", got.append)
        lost = stale.channel(room, private)
        await subscribed(kept, kept_states)
        await subscribed(lost, lost_states)
        await refreshed.set_auth(user_token(member))
        # The control: the client that kept its short token is closed when it expires, with
        # Supabase's reason; the refreshed one, joined with the same token, is not.
        await wait_for(lambda: lost.state == ChannelStates.CLOSED, "the stale client's channel is closed",
                       seconds=SHORT + 10)
        assert time.time() >= expires - 1, "closed before its token expired"
        assert any(s == "CHANNEL_ERROR" and "Token has expired" in str(e) for s, e in lost_states), lost_states
        # Past the first token's expiry on every clock, the refreshed channel still receives.
        await wait_for(lambda: time.time() > expires + 1, "the first token's expiry", seconds=SHORT + 10)
        db.execute("SELECT realtime.send('{\"n\": 1}', 'tick', %s)", (room,))
        await wait_for(lambda: got, "a broadcast after the first token expired")
        assert [m["payload"]["n"] for m in got] == [1]
        assert kept.state == ChannelStates.JOINED
        assert kept_states == [("SUBSCRIBED", None)], kept_states
