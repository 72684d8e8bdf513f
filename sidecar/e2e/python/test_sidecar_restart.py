"""A sidecar killed (SIGKILL, by PID) and started again on its port: supabase-py's realtime
client reconnects on its own, rejoins its channel and receives again."""

import uuid

from conftest import connected, subscribed, wait_for


async def test_the_client_reconnects_rejoins_and_receives_after_a_sidecar_restart(sidecar, db):
    topic = f"py-restart-{uuid.uuid4()}"
    async with connected(sidecar) as client:
        got, states = [], []
        channel = client.channel(topic).on_broadcast("n", got.append)
        await subscribed(channel, states)
        db.execute("SELECT realtime.send('{\"n\": 1}', 'n', %s, false)", (topic,))
        await wait_for(lambda: len(got) == 1, "a message before the restart")
        socket_before = client._ws_connection
        sidecar.kill()
        # The client notices the dead socket and reports the channel errored.
        await wait_for(lambda: any(s == "CHANNEL_ERROR" for s, _ in states), "the client sees the socket drop")
        sidecar.start()
        await wait_for(lambda: client.is_connected and client._ws_connection is not socket_before,
                       "the client reconnects on its own", seconds=20)
        # The new sidecar process knows nothing of the channel: a message reaches it only if
        # the client joined again.
        await wait_for(lambda: channel.is_joined and states[-1][0] == "SUBSCRIBED", "the channel rejoins", seconds=20)
        db.execute("SELECT realtime.send('{\"n\": 2}', 'n', %s, false)", (topic,))
        await wait_for(lambda: len(got) >= 2, "a message after the restart")
        # realtime.send adds the message's id to its payload.
        assert [m["payload"]["n"] for m in got] == [1, 2]
