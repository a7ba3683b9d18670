"""Webhook secrets at rest: sealed with a server key, opened only to sign a delivery.

A webhook secret is an HMAC key: the server must *use* it for every delivery, so it
cannot be hashed like an API token. It is the next best thing: encrypted in the
database (Fernet: AES-128-CBC + HMAC-SHA256) under a key that is not in the database,
so a copy of the database (a backup, a dump, a read-only SQL account, the API) holds no
usable secret.

The key is ``FLEETSCOPE_WEBHOOK_SECRET_KEY`` (32+ characters; every replica sharing a
database must have the same one). Unset, a random key is created once in
``./.fleetscope/webhook-secret.key`` (mode 0600) next to the default data.
Rows written before sealing existed are plaintext; :func:`seal_legacy` seals them at
dispatcher start, and :meth:`SecretBox.open` reads both meanwhile.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import threading
from pathlib import Path
from typing import Any

from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

log = logging.getLogger(__name__)

PREFIX = "fernet:v1:"
MIN_SECRET_CHARS = 16
"""Shortest webhook secret accepted (as for the API token)."""
MAX_SECRET_CHARS = 500
MIN_KEY_CHARS = 32
DEFAULT_KEY_FILE = Path(".fleetscope") / "webhook-secret.key"


class SecretKeyError(RuntimeError):
    """A sealed secret cannot be opened with this server's key (the message says why)."""


class SecretBox:
    """Seals and opens webhook secrets with one server key."""

    def __init__(self, key_material: str) -> None:
        if len(key_material) < MIN_KEY_CHARS:
            raise ValueError(f"webhook_secret_key: must be at least {MIN_KEY_CHARS} characters")
        raw = HKDF(algorithm=hashes.SHA256(), length=32, salt=b"fleetscope-webhook-secrets",
                   info=b"fernet-v1").derive(key_material.encode())  # fmt: skip
        self._fernet = Fernet(base64.urlsafe_b64encode(raw))
        self.key_id = hashlib.sha256(raw).hexdigest()[:8]
        """Short fingerprint of the key, safe to log (tells replicas' keys apart)."""

    def seal(self, secret: str) -> str:
        """The stored form of ``secret`` ('' stays '': no signature)."""
        if not secret:
            return ""
        return PREFIX + self._fernet.encrypt(secret.encode()).decode("ascii")

    def open(self, stored: str) -> str:
        """The secret of a stored value (sealed, legacy plaintext or '').

        Raises:
            SecretKeyError: sealed under another key.
        """
        if not stored.startswith(PREFIX):
            return stored
        try:
            return self._fernet.decrypt(stored[len(PREFIX):].encode("ascii")).decode()
        except (InvalidToken, ValueError):
            raise SecretKeyError(
                f"webhook secret sealed under another key than this server's (key id {self.key_id}); "
                "every replica needs the same FLEETSCOPE_WEBHOOK_SECRET_KEY"
            ) from None


def is_sealed(stored: str) -> bool:
    return stored.startswith(PREFIX)


_BOXES: dict[tuple[str, str], SecretBox] = {}
_LOCK = threading.Lock()


def box_for(settings: Any) -> SecretBox:
    """The :class:`SecretBox` of a server's settings (one per key, created once)."""
    key = settings.webhook_secret_key
    material = key.get_secret_value() if key is not None else ""
    path = "" if material else str(DEFAULT_KEY_FILE.resolve())
    with _LOCK:
        box = _BOXES.get((material, path))
        if box is None:
            box = SecretBox(material or _key_file(Path(path)))
            _BOXES[(material, path)] = box
        return box


def _key_file(path: Path) -> str:
    """Read the key file, creating it (0600, random 256 bits) when missing."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    material = base64.urlsafe_b64encode(os.urandom(32)).decode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # created by a concurrent process
        return path.read_text().strip()
    with os.fdopen(fd, "w") as f:
        f.write(material + "\n")
    log.warning("webhook secrets: created key file %s (set FLEETSCOPE_WEBHOOK_SECRET_KEY to share one "
                "key between replicas)", path)
    return material


def seal_legacy(session: Any, box: SecretBox) -> int:
    """Seal plaintext secrets left by older versions; returns how many were sealed."""
    from fleetscope.server.db.diagnosis_models import Webhook
    from sqlalchemy import select

    n = 0
    for hook in session.scalars(select(Webhook).where(Webhook.secret != "")):
        if not is_sealed(hook.secret):
            hook.secret = box.seal(hook.secret)
            n += 1
    if n:
        session.commit()
        log.info("webhook secrets: sealed %d plaintext secret(s)", n)
    return n
