"""The manager tokens the catalog keeps, sealed with a key that is not in the catalog.

The manager must present each wrapper's manager token, so it cannot keep only a hash of it
as it does for the API's tokens. It keeps the token sealed instead (Fernet: AES-128-CBC and
HMAC-SHA256, from the ``cryptography`` package) with a key kept in a file of its own, 0600:
a copy of the catalog that leaves without the key file (a backup, a dump, another user of a
PostgreSQL server) holds no usable token. Where the catalog is an SQLite file, the key file
lives next to it (in the data directory by default); with a catalog on a database server,
the manager's data directory holds it. The key is made the first time a token is sealed.

>>> import tempfile
>>> sealer = TokenSealer(Path(tempfile.mkdtemp()) / KEY_FILE)
>>> sealed = sealer.seal("the-wrappers-manager-token")
>>> "manager-token" in sealed, sealer.unseal(sealed)
(False, 'the-wrappers-manager-token')
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken
from sqlalchemy.engine import make_url

from contract.file_modes import PRIVATE

KEY_FILE = "catalog.key"


class SealError(Exception):
    """The key file cannot be read or made, or does not open a sealed token."""


class TokenSealer:
    """Seals and unseals tokens with the key in ``key_file``, made on first use."""

    def __init__(self, key_file: Path) -> None:
        self.key_file = key_file
        self._lock = threading.Lock()
        self._fernet: Fernet | None = None

    def seal(self, token: str) -> str:
        return self._key().encrypt(token.encode()).decode("ascii")

    def unseal(self, sealed: str) -> str:
        try:
            return self._key().decrypt(sealed.encode("ascii")).decode()
        except (InvalidToken, UnicodeError) as exc:
            raise SealError(
                f"a manager token in the catalog does not open with the key in {self.key_file}: "
                "the catalog was sealed with another key file (was it moved without its key?)"
            ) from exc

    def _key(self) -> Fernet:
        with self._lock:
            if self._fernet is None:
                self._fernet = Fernet(self._read_or_make())
            return self._fernet

    def _read_or_make(self) -> bytes:
        if not self.key_file.exists():
            self._make()
        try:
            key = self.key_file.read_bytes().strip()
        except OSError as exc:
            raise SealError(f"cannot read the catalog's key file {self.key_file}: {exc.strerror}") from exc
        try:
            Fernet(key)
        except ValueError as exc:
            raise SealError(f"{self.key_file} is not a catalog key file (32 url-safe base64-encoded bytes)") from exc
        return key

    def _make(self) -> None:
        self.key_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.key_file.with_name(f".{self.key_file.name}.{os.getpid()}.new")
        tmp.unlink(missing_ok=True)  # left by a crashed process of the same id
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, PRIVATE.file_mode)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(Fernet.generate_key())
                f.flush()
                os.fsync(f.fileno())
            os.link(tmp, self.key_file)
        except FileExistsError:
            pass  # another process made the key meanwhile: theirs is the key
        finally:
            tmp.unlink()


def key_file_for(catalog_url: str, data_dir: Path | None) -> Path | None:
    """Where the key of a catalog's sealed tokens lives: next to an SQLite catalog file, else
    in the manager's data directory (None without one: such a catalog can keep no token).

    >>> key_file_for("sqlite:////var/pvm/catalog.db", None)
    PosixPath('/var/pvm/catalog.key')
    >>> key_file_for("postgresql://pvm@db/pvm", Path("/var/pvm"))
    PosixPath('/var/pvm/catalog.key')
    """
    url = make_url(catalog_url)
    if url.get_backend_name() == "sqlite" and url.database is not None and url.database not in ("", ":memory:"):
        return Path(url.database).parent / KEY_FILE
    return None if data_dir is None else data_dir / KEY_FILE
