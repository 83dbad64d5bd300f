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

A set of files that belong together (a transcoder set: one file per layer and a config) is written
the same way as one folder with `atomic_folder`: into a temporary folder beside the target, which
takes the target's name only when every file is in it; an old folder there goes only once the new
one has its name (if that rename fails, the old one gets its name back).

    >>> with atomic_folder("transcoders") as tmp:
    ...     for layer, state in enumerate(states):
    ...         save_file(state, tmp / f"layer_{layer}.safetensors")
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["atomic_path", "atomic_folder", "write_atomic"]


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
            os.chmod(tmp, 0o666 & ~_umask())
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


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


@contextmanager
def atomic_folder(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a new, empty temporary folder beside `path`; when the block ends without an error, it takes
    `path`'s place (an old folder there is replaced). On an error nothing replaces it and it goes.
    Its permissions are an old folder's, or a new folder's under the umask (mkdtemp makes 0700)."""
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise NotADirectoryError(f"path: {str(target)!r} is a file; expected a folder path")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        os.chmod(tmp, target.stat().st_mode & 0o7777 if target.exists() else 0o777 & ~_umask())
        yield tmp
        swap_in(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def swap_in(tmp: Path, target: Path, rename: Callable[[Path, Path], None] = os.replace) -> None:
    """Give the finished folder `tmp` the name `target`; an old `target` goes only once the new one is
    there, and comes back under its name if that rename fails (`rename` is os.replace; tests pass another)."""
    if not target.exists():
        rename(tmp, target)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
    old.rmdir()
    rename(target, old)
    try:
        rename(tmp, target)
    except BaseException:
        rename(old, target)  # the old folder back under its name
        raise
    shutil.rmtree(old, ignore_errors=True)
