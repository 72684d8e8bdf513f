"""supabase-py's realtime client with tokens as today's Supabase signs them: keys made by
`cryptography`, tokens minted by PyJWT, the public keys given to the sidecar as Supabase's
static JWKS (API_JWT_JWKS) and chosen by the token's `alg` and `kid`."""

import json
import time
import uuid

import jwt
import pytest
from conftest import Sidecar, connected, drop_consumer, load_private_policies, subscribed, wait_for
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

KEYS = {
    "ec-1": ("ES256", ec.generate_private_key(ec.SECP256R1()), ECAlgorithm),
    "rsa-1": ("RS256", rsa.generate_private_key(public_exponent=65537, key_size=2048), RSAAlgorithm),
    "ed-1": ("EdDSA", ed25519.Ed25519PrivateKey.generate(), OKPAlgorithm),
}


def signed(kid, claims, key_of=None):
    """A token of `claims` signed with the key `kid` names (or with `key_of`'s key)."""
    alg, key, _ = KEYS[key_of or kid]
    claims = dict(claims)
    claims.setdefault("exp", int(time.time()) + 3600)
    return jwt.encode(claims, key, algorithm=alg, headers={"kid": kid})


@pytest.fixture(scope="module")
def sidecar():
    keys = []
    for kid, (alg, key, algorithm) in KEYS.items():
        jwk = json.loads(algorithm.to_jwk(key.public_key()))
        keys.append({**jwk, "kid": kid, "alg": alg, "use": "sig"})
    s = Sidecar("py_asymmetric_tokens", {"API_JWT_JWKS": json.dumps({"keys": keys})})
    drop_consumer(s.consumer)
    s.start()
    yield s
    s.stop()
    drop_consumer(s.consumer)


async def test_es256_anon_key_and_session_join_a_private_channel(sidecar, db):
    room = f"room:py-es256-{uuid.uuid4()}"
    member = str(uuid.uuid4())
    load_private_policies(db)
    db.execute("INSERT INTO private_members VALUES (%s, %s, false)", (member, room))
    anon = signed("ec-1", {"role": "anon", "iss": "supabase"})
    session = signed("ec-1", {"role": "authenticated", "sub": member, "aud": "authenticated"})
    async with connected(sidecar, session, apikey=anon) as client:
        got = []
        channel = client.channel(room, {"config": {"private": True}}).on_broadcast("hi", got.append)
        await subscribed(channel)
        db.execute("SELECT realtime.send('{\"n\": 1}', 'hi', %s)", (room,))
        await wait_for(lambda: got, "the private broadcast")
        assert got[0]["payload"]["n"] == 1


@pytest.mark.parametrize("kid", ["rsa-1", "ed-1"])
async def test_rs256_and_eddsa_tokens_join_and_a_wrong_kid_is_refused(sidecar, kid):
    anon = signed("ec-1", {"role": "anon"})
    # A decimal exp, as the JWT spec allows.
    good = signed(kid, {"role": "anon", "exp": time.time() + 3600.5})
    async with connected(sidecar, good, apikey=anon) as client:
        await subscribed(client.channel(f"py-{kid}-{uuid.uuid4()}"))
    # Signed by the EC key under this kid: the kid names no EC key.
    wrong = signed(kid, {"role": "anon"}, key_of="ec-1")
    async with connected(sidecar, wrong, apikey=anon) as client:
        states = []
        with pytest.raises(AssertionError):
            await subscribed(client.channel(f"py-{kid}-wrong-{uuid.uuid4()}"), states)
        # The client hands the join's error payload on as the exception's text.
        reasons = [json.loads(str(e))["reason"] for s, e in states if s == "CHANNEL_ERROR"]
        assert reasons == [
            f'JwtSignerError: Failed to generate JWT signer for key ID (kid) "{kid}", '
            "check your JWT secret or JWKS configuration"
        ], states
