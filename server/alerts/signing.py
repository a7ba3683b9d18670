"""HMAC-SHA256 signatures of webhook bodies.

Headers sent with every delivery to a webhook that has a secret::

    X-Fleetscope-Timestamp: 1764460800            (Unix seconds)
    X-Fleetscope-Signature: sha256=<hex HMAC-SHA256(secret, timestamp + "." + body)>

Receivers recompute the HMAC over the raw body and reject stale timestamps (replay).
"""

from __future__ import annotations

import hashlib
import hmac
import time

SIGNATURE_HEADER = "X-Fleetscope-Signature"
TIMESTAMP_HEADER = "X-Fleetscope-Timestamp"


def signature(secret: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def sign_headers(secret: str, body: bytes, now_s: int | None = None) -> dict[str, str]:
    """Headers to send with ``body``; empty when there is no secret."""
    if not secret:
        return {}
    ts = int(time.time()) if now_s is None else int(now_s)
    return {TIMESTAMP_HEADER: str(ts), SIGNATURE_HEADER: signature(secret, ts, body)}


def verify(secret: str, headers: dict[str, str], body: bytes, max_age_s: float = 300.0,
           now_s: float | None = None) -> bool:
    """True when the signature matches and the timestamp is fresh (receiver side).

    Never raises on what a sender put in the headers: a missing, non-ASCII or
    malformed signature or timestamp is simply not a valid signature.
    """
    low = {k.lower(): v for k, v in headers.items()}
    try:
        ts_text = str(low[TIMESTAMP_HEADER.lower()])
        given = str(low[SIGNATURE_HEADER.lower()])
    except KeyError:
        return False
    if not (ts_text.isascii() and ts_text.isdigit() and len(ts_text) <= 12) or not given.isascii():
        return False  # compare_digest raises on non-ASCII str; int() takes non-ASCII digits
    ts = int(ts_text)
    now = time.time() if now_s is None else now_s
    if abs(now - ts) > max_age_s:
        return False
    return hmac.compare_digest(given.encode("ascii"), signature(secret, ts, body).encode("ascii"))
