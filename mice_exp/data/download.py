"""Fetch a data file once into the cache, trusting it only if its sha256 matches."""

from __future__ import annotations

import os
import shutil
import tempfile
import urllib.request
from pathlib import Path

from mice_exp.cache import file_sha256
from mice_exp.errors import UserError


def download(url: str, dest: Path, sha256: str) -> Path:
    """Download ``url`` (any scheme urllib knows, ``file://`` included) to ``dest``.

    The file is written under a temporary name and moved into place only after its
    sha256 matched, so a failed or tampered download never sits in the cache and
    concurrent runs never see a half-written file.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=60) as response:
            shutil.copyfileobj(response, out)
        actual = file_sha256(tmp)
        if actual != sha256:
            raise UserError(
                f"download of {url} has sha256 {actual}, expected {sha256} (dataset.sha256); "
                "the file was discarded"
            )
        os.replace(tmp, dest)
    except (OSError, ValueError) as error:  # URLError is an OSError; a bad URL is a ValueError
        raise UserError(
            f"could not download {url} ({error}); set dataset.path to a local copy"
        ) from error
    finally:
        tmp.unlink(missing_ok=True)
    return dest
