"""Content-addressed cache folders and atomic writes shared by every stage."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import tempfile
import zipfile
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TypeVar

import numpy as np

from mice_exp.errors import UserError

log = logging.getLogger(__name__)
T = TypeVar("T")
#: What reading a truncated or garbled cache file raises (JSON, UTF-8, zip, npy headers).
DAMAGE = (ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error)
#: What a full or read-only disk raises on write.
NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)


def stable_hash(payload: Any, length: int = 16) -> str:
    """Hash of a JSON-serialisable payload, independent of dict key order."""
    text = json.dumps(payload, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file, read in chunks so large files stay cheap."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


#: The mode a plain ``open`` gives a new file (mkstemp's 0600 would keep a published records file from
#: everyone but its writer).
FILE_MODE = 0o666 & ~_umask()


def write_atomic(path: Path, write: Callable[[Any], None]) -> None:
    """Write through a temp file in the same folder, then rename: readers never see a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json(path: Path, payload: Any) -> None:
    write_atomic(path, lambda h: h.write(json.dumps(payload, indent=2, sort_keys=True, default=str).encode()))


def write_text(path: Path, text: str) -> None:
    write_atomic(path, lambda h: h.write(text.encode("utf-8")))


def write_jsonl(path: Path, rows: Iterable[dict]) -> None:
    data = "".join(json.dumps(row, sort_keys=True, ensure_ascii=False) + "\n" for row in rows)
    write_atomic(path, lambda h: h.write(data.encode()))


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    write_atomic(path, lambda h: np.savez(h, **arrays))


def read_npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        return {key: data[key] for key in data.files}


def read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def read_json_if(path: Path) -> Any:
    """The JSON at ``path``, or None when it does not exist yet."""
    if not path.exists():
        return None
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def set_aside(path: Path, reason: object) -> None:
    """Rename a damaged cache file to ``*.damaged`` (kept for a look, ignored by every reader), with a warning."""
    target = path.with_name(path.name + ".damaged")
    try:
        os.replace(path, target)
    except FileNotFoundError:  # a concurrent job set it aside first
        return
    log.warning("%s is damaged (%s); set aside as %s and recomputed", path, reason, target.name)


def read_intact(path: Path, read: Callable[[Path], T]) -> T | None:
    """``read(path)``; None when the file is missing, or damaged (then set aside, so it gets recomputed)."""
    try:
        return read(path)
    except FileNotFoundError:
        return None
    except DAMAGE as error:
        set_aside(path, f"{type(error).__name__}: {error}")
        return None


def unwritable(folder: Path) -> str | None:
    """Why nothing can be written in ``folder`` or its nearest existing parent (None when something can).

    Tried rather than read from the permission bits, which neither root nor a read-only mount respect.
    """
    existing = Path(folder)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".write-probe-")
    except OSError as error:
        return f"{existing}: {error.strerror}"
    os.close(fd)
    os.unlink(probe)
    return None


@contextmanager
def write_guard(folder: Path, kept: Callable[[], str]) -> Iterator[None]:
    """A full or read-only disk while writing under ``folder`` becomes one line saying what was kept."""
    try:
        yield
    except OSError as error:
        if error.errno not in NO_ROOM:
            raise
        raise UserError(f"cannot write {error.filename or folder} ({error.strerror}); {kept()}; expected free "
                        f"space and a writable paths.cache (free some space or pass paths.cache=...)") from None
