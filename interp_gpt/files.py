"""The one way interp_gpt writes a file: whole or not at all.

Every save (checkpoints, pages, figures, tokenizers, and the shards and manifests later
features write) goes through `atomic_path` or `write_atomic`: the data goes to a temporary
file in the same folder, is flushed to disk, and only then replaces the target with
`os.replace` (atomic on POSIX and Windows). If anything fails on the way (a full disk, an
exception, Ctrl-C) the temporary file is removed and the target is untouched: it holds the
old content, or does not exist.

    >>> with atomic_path("page.html") as tmp:
    ...     fig.write_html(tmp)          # any writer that takes a path
    >>> write_atomic("config.json", json.dumps(cfg))
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["atomic_path", "write_atomic"]


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside `path`; when the block ends without an error, the file
    written there replaces `path`. On an error nothing replaces it and the temporary goes."""
    target = Path(path)
    if target.is_dir():
        raise IsADirectoryError(f"path: {str(target)!r} is a folder; expected a file path")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        try:
            yield tmp
        except OSError as e:  # a writer's own error (a full disk ...) may name only the temporary
            if str(target) in str(e):
                raise
            raise OSError(e.errno, f"{target}: could not be written ({e.strerror or e}); it is as it was") from e
        if not tmp.exists():
            raise FileNotFoundError(f"{tmp}: the writer left no file to put in place of {target}")
        with open(tmp, "rb+") as f:  # on disk before it takes the target's name
            os.fsync(f.fileno())
        if target.exists():  # keep the old file's permissions (mkstemp makes 0600)
            os.chmod(tmp, target.stat().st_mode & 0o7777)
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: str | os.PathLike[str], data: str | bytes, encoding: str = "utf-8") -> Path:
    """Write `data` (text or bytes) to `path` whole or not at all; returns the path."""
    if not isinstance(data, (str, bytes)):
        raise TypeError(f"data: expected str or bytes, got {type(data).__name__}")
    with atomic_path(path) as tmp:
        if isinstance(data, str):
            tmp.write_text(data, encoding=encoding)
        else:
            tmp.write_bytes(data)
    return Path(path)
