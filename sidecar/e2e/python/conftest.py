"""What the Python-client tests share: a sidecar process (started, killed and started again
by PID), tokens signed like Supabase's, the test database, connected clients and bounded
waits. The environment is the one scripts/test.sh gives the realtime-js tests: SIDECAR_BIN,
PG_REALTIME_SIDECAR_DSN (the sidecar's least-privilege login) and PG_REALTIME_TEST_DSN."""

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import asynccontextmanager

import psycopg
import pytest
from realtime import AsyncRealtimeClient

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../../.."))
sys.path.insert(0, os.path.join(ROOT, "pgbench"))
import harness  # noqa: E402  (the benchmark runners' helpers: token signing, health wait)

SECRET = "python-client-secret-with-enough-length"


def token(claims=None, seconds=3600):
    """An HS256 JWT signed with the sidecar's secret: anon by default, valid `seconds`."""
    claims = dict(claims or {"role": "anon"})
    claims.setdefault("exp", int(time.time()) + seconds)
    return harness.jwt_hs256(claims, SECRET)


def user_token(sub, seconds=3600):
    return token({"role": "authenticated", "sub": sub}, seconds)


APIKEY = token()


def free_port():
    """A free port: one the system picks, or the first free one of E2E_PORTS (LOW-HIGH) when
    set (a developer sharing the machine keeps to a range of their own)."""
    low, _, high = os.environ.get("E2E_PORTS", "0-0").partition("-")
    for port in range(int(low), int(high) + 1):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError(f"no free port in E2E_PORTS={os.environ['E2E_PORTS']}")


class Sidecar:
    """One sidecar process on a port of its own; `kill()` and `start()` again keep the port."""

    def __init__(self, consumer, env=None):
        for var in ("SIDECAR_BIN", "PG_REALTIME_SIDECAR_DSN"):
            assert os.environ.get(var), f"{var} must be set (scripts/test.sh sets it)"
        self.consumer = consumer
        self.env = env or {}
        self.port = free_port()
        self.process = None

    @property
    def url(self):
        return f"ws://127.0.0.1:{self.port}/realtime/v1"

    def start(self):
        env = dict(os.environ, PORT=str(self.port), API_JWT_SECRET=SECRET,
                   DATABASE_URL=os.environ["PG_REALTIME_SIDECAR_DSN"], CONSUMER_NAME=self.consumer,
                   LOG_LEVEL="warn", **self.env)
        self.process = subprocess.Popen([os.environ["SIDECAR_BIN"]], env=env, stdout=sys.stderr)
        harness.wait_healthy(f"http://127.0.0.1:{self.port}/healthz", self.process, "the sidecar", 15)

    def kill(self):
        """SIGKILL by PID: no goodbye to any client."""
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)


def drop_consumer(name):
    """Frees a consumer slot: slots live as long as the server, and the suite's cluster has
    a bounded number of them (a slot left by an earlier run would also resume from its old
    position)."""
    with psycopg.connect(os.environ["PG_REALTIME_TEST_DSN"], autocommit=True) as conn:
        conn.execute("SELECT realtime.drop_consumer(%s)", (name,))


@pytest.fixture(scope="module")
def sidecar(request):
    """A sidecar for the test file, with a fresh consumer slot named after it, freed after."""
    s = Sidecar("py_" + request.module.__name__.removeprefix("test_"))
    drop_consumer(s.consumer)
    s.start()
    yield s
    s.stop()
    drop_consumer(s.consumer)


@pytest.fixture(scope="module")
def db():
    """The superuser's connection (fixtures and writes), autocommit."""
    with psycopg.connect(os.environ["PG_REALTIME_TEST_DSN"], autocommit=True) as conn:
        yield conn


def load_private_policies(db):
    """Supabase's auth helpers and the private-channel policies the Rust and realtime-js
    tests use (members read their rooms; those with can_write also send)."""
    for f in ("pgbench/supabase_auth.sql", "sidecar/tests/private_policies.sql"):
        with open(os.path.join(ROOT, f)) as sql:
            db.execute(sql.read())


@asynccontextmanager
async def connected(sidecar, access_token=None, apikey=APIKEY):
    """A client of the sidecar as supabase-py makes one (apikey in the URL), with
    `access_token` set before any join; every channel left and the socket closed after."""
    client = AsyncRealtimeClient(sidecar.url, token=apikey)
    if access_token:
        await client.set_auth(access_token)
    await client.connect()
    try:
        yield client
    finally:
        await client.remove_all_channels()


async def subscribed(channel, states=None, seconds=10):
    """Subscribes and returns once SUBSCRIBED; fails with the server's reason otherwise.
    Every later state the channel reports (with its error) is appended to `states`."""
    states = [] if states is None else states
    await asyncio.wait_for(channel.subscribe(lambda state, err: states.append((state, err))), seconds)
    assert states and states[-1][0] == "SUBSCRIBED", f"subscribe ended with {states}"
    return channel


async def wait_for(cond, what, seconds=10):
    """Returns once `cond()` holds (checked every 20 ms); fails naming `what` after `seconds`."""
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, f"timed out after {seconds} s waiting for {what}"
        await asyncio.sleep(0.02)
