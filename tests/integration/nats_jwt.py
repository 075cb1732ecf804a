"""NATS decentralized authentication made with Python alone, as nsc makes
it: nkeys (operator, account, user), the JWTs that chain them, and a user's
credentials file, for a nats-server in operator mode (test_nats.py).

An nkey (github.com/nats-io/nkeys, strkey.go) is an ed25519 key written as
base32 without padding of: a prefix byte naming its kind, the 32 bytes, and
a CRC16-XMODEM of both, little-endian. A seed packs two prefixes into its
first two bytes ("S" for seed, then the kind), so that it prints as "SO",
"SA" or "SU". A JWT (github.com/nats-io/jwt, v2/claims.go) is signed with
the issuer's ed25519 key ("ed25519-nkey"); its jti is the SHA-512/256 of
the claims without it, in base32; what is NATS's own is under "nats"."""
import base64
import hashlib
import json
import os
import time

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

# nkeys' prefix bytes: the kind, in the top five bits of the first byte
PREFIX = {"operator": 14 << 3, "account": 0, "user": 20 << 3}
PREFIX_SEED = 18 << 3
UNLIMITED = -1   # nats-io/jwt's NoLimit: a limit of 0 would allow nothing


def crc16_xmodem(data):
    """CRC-16/XMODEM (polynomial 0x1021, initial 0), as nkeys' crc16.go."""
    crc = 0
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def base32(raw):
    return base64.b32encode(raw).decode().rstrip("=")


def with_crc(raw):
    return base32(raw + crc16_xmodem(raw).to_bytes(2, "little"))


class NKey:
    """An ed25519 key of one kind (operator, account or user): its public
    key and seed as NATS writes them, and its signature."""

    def __init__(self, kind):
        self.kind = kind
        self.raw_seed = os.urandom(32)
        self.key = Ed25519PrivateKey.from_private_bytes(self.raw_seed)

    @property
    def public(self):
        raw = self.key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        return with_crc(bytes([PREFIX[self.kind]]) + raw)

    @property
    def seed(self):
        # nkeys' EncodeSeed: 5 bits of "seed", then the kind's 8 bits
        # across the two bytes, so that base32 prints "S" and the kind
        kind = PREFIX[self.kind]
        return with_crc(bytes([PREFIX_SEED | kind >> 5, (kind & 31) << 3]) + self.raw_seed)

    def sign(self, data):
        return self.key.sign(data)


def b64url(raw):
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def compact(value):
    """JSON as Go's json.Marshal writes it (no spaces)."""
    return json.dumps(value, separators=(",", ":"))


def encode_jwt(issuer, subject, name, nats):
    """A JWT of subject, issued (and signed) by the nkey issuer, with NATS's
    claims nats ({"type": ..., ...}; version 2 added)."""
    # the standard claims in nats-io/jwt's ClaimsData order, empty ones
    # left out (omitempty); jti is their hash without it
    claims = {"iat": int(time.time()), "iss": issuer.public, "name": name, "sub": subject}
    claims["jti"] = base32(hashlib.new("sha512_256", compact(claims).encode()).digest())
    claims["nats"] = dict(nats, version=2)
    header = b64url(compact({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    signed = header + "." + b64url(compact(claims).encode())
    return signed + "." + b64url(issuer.sign(signed.encode()))


def operator_jwt(operator, system, name="tern-test"):
    """The operator's own JWT (self-signed), naming its system account
    (without one, nats-server cannot start JetStream)."""
    return encode_jwt(operator, operator.public, name,
                      {"type": "operator", "system_account": system.public})


def account_jwt(operator, account, name, jetstream):
    """An account's JWT, issued by operator, without limits; jetstream:
    JetStream enabled (its storage limits non-zero), as tern's numbered
    topics need (the system account may not have it)."""
    limits = {"subs": UNLIMITED, "data": UNLIMITED, "payload": UNLIMITED,
              "imports": UNLIMITED, "exports": UNLIMITED, "wildcards": True,
              "conn": UNLIMITED, "leaf": UNLIMITED}
    if jetstream:
        limits.update({"mem_storage": UNLIMITED, "disk_storage": UNLIMITED,
                       "streams": UNLIMITED, "consumer": UNLIMITED})
    return encode_jwt(operator, account.public, name,
                      {"type": "account", "limits": limits, "default_permissions":
                       {"pub": {}, "sub": {}}})


def user_jwt(account, user, name="tern"):
    """A user's JWT, issued by account: every subject allowed, no limit."""
    return encode_jwt(account, user.public, name,
                      {"type": "user", "pub": {}, "sub": {}, "subs": UNLIMITED,
                       "data": UNLIMITED, "payload": UNLIMITED})


def creds(jwt, seed):
    """A user's credentials file, as nsc writes it (nats-io/jwt's
    FormatUserConfig): the JWT, then the seed that proves it is the user's."""
    return ("-----BEGIN NATS USER JWT-----\n" + jwt + "\n------END NATS USER JWT------\n\n"
            "************************* IMPORTANT *************************\n"
            "NKEY Seed printed below can be used to sign and prove identity.\n"
            "NKEYs are sensitive and should be treated as secrets.\n\n"
            "-----BEGIN USER NKEY SEED-----\n" + seed + "\n------END USER NKEY SEED------\n\n"
            "*************************************************************\n")


class Operator:
    """An operator with its system account and one account for tern: what
    a nats-server in operator mode is given (config()) and what a user of
    the account connects with (user_creds())."""

    def __init__(self):
        self.operator = NKey("operator")
        self.system = NKey("account")
        self.account = NKey("account")

    def config(self):
        """nats-server's configuration: the operator trusted, both accounts
        preloaded into a resolver held in memory."""
        return (f"operator: {operator_jwt(self.operator, self.system)}\n"
                "resolver: MEMORY\n"
                "resolver_preload: {\n"
                f"  {self.system.public}: "
                f"{account_jwt(self.operator, self.system, 'SYS', jetstream=False)}\n"
                f"  {self.account.public}: "
                f"{account_jwt(self.operator, self.account, 'TERN', jetstream=True)}\n"
                "}\n")

    def user_creds(self, account=None, seed_of=None):
        """A user's credentials file: a user of account (by default tern's,
        which the server knows), with the seed of seed_of (by default the
        user's own)."""
        user = NKey("user")
        return creds(user_jwt(account or self.account, user), (seed_of or user).seed)
