"""Postgres Changes with supabase-py's realtime client: a filter and RLS together. Absence is
proven by order, never by waiting: a channel gets its changes in commit order, so once a
later row has arrived, an earlier one that did not will never come."""

import os
import uuid

import pytest
from conftest import ROOT, connected, subscribed, user_token, wait_for


@pytest.fixture(scope="module")
def notes(db):
    with open(os.path.join(ROOT, "pgbench/supabase_auth.sql")) as sql:
        db.execute(sql.read())
    db.execute("""
        DROP TABLE IF EXISTS py_notes;
        CREATE TABLE py_notes (id bigint PRIMARY KEY, owner uuid NOT NULL, room int NOT NULL, body text);
        ALTER TABLE py_notes ENABLE ROW LEVEL SECURITY;
        CREATE POLICY own ON py_notes FOR SELECT TO authenticated USING (owner = auth.uid());
        GRANT SELECT ON py_notes TO authenticated;
        ALTER PUBLICATION supabase_realtime ADD TABLE py_notes""")
    return "py_notes"


async def test_a_filtered_subscription_gets_only_the_rows_rls_lets_it_see(sidecar, db, notes):
    me, other = str(uuid.uuid4()), str(uuid.uuid4())
    async with connected(sidecar, user_token(me)) as client:
        got, system = [], []
        channel = (client.channel("py-notes")
                   .on_postgres_changes("INSERT", got.append, table=notes, schema="public", filter="room=eq.1")
                   .on_system(system.append))
        await subscribed(channel)
        await wait_for(lambda: any(s.message == "Subscribed to PostgreSQL" for s in system),
                       "the server says the subscription is ready")
        rows = [(1, other, 1, "someone else's, in room 1: RLS hides it"),
                (2, me, 2, "mine, in room 2: the filter drops it"),
                (3, me, 1, "mine, in room 1"),
                (4, other, 2, "neither"),
                (5, me, 1, "mine, in room 1, last")]
        for row in rows:
            db.execute(f"INSERT INTO {notes} VALUES (%s, %s, %s, %s)", row)
        await wait_for(lambda: any(c["data"]["record"]["id"] == 5 for c in got), "the last visible row")
        assert [c["data"]["record"]["id"] for c in got] == [3, 5]
        first = got[0]["data"]
        assert (first["type"], first["schema"], first["table"]) == ("INSERT", "public", notes)
        assert first["record"] == {"id": 3, "owner": me, "room": 1, "body": "mine, in room 1"}
        assert first["errors"] is None
