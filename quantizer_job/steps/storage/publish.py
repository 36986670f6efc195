"""Atomic, idempotent publication on the model volume.

Work happens in ``<root>/artifacts/.tmp-<id>-<random>/`` (same filesystem as the final path), and the finished
directory is renamed to ``<root>/artifacts/<id>`` in one step. A rename onto an existing directory fails, so an
artifact once published is never overwritten. A per-artifact ``flock`` marks temp dirs of live runs; any temp dir of
the same artifact found while holding the lock belongs to a dead run and is removed.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Any

from quantizer_job.steps.common.errors import JobError
from rerank_contracts.artifact_layout import ARTIFACTS_DIR, MANIFEST_FILE, artifact_dir

TMP_PREFIX = ".tmp-"
LOCK_PREFIX = ".lock-"


def valid_artifact_id(artifact_id: str) -> bool:
    import re

    return bool(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", artifact_id)) and ".." not in artifact_id


def artifacts_root(root: str) -> Path:
    return Path(root) / ARTIFACTS_DIR


def final_path(root: str, artifact_id: str) -> Path:
    return Path(artifact_dir(root, artifact_id))


def read_published(root: str, artifact_id: str) -> dict[str, Any] | None:
    """The manifest of a finished artifact, or None when there is none."""
    p = final_path(root, artifact_id) / MANIFEST_FILE
    try:
        manifest: dict[str, Any] = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise JobError("PublishFailed", f"{p} exists but is unreadable: {exc}") from None
    return manifest


class ArtifactLock:
    """Exclusive flock on ``<root>/artifacts/.lock-<id>``; released by the kernel when the process dies."""

    def __init__(self, root: str, artifact_id: str):
        self.path = artifacts_root(root) / f"{LOCK_PREFIX}{artifact_id}"
        self.fd: int | None = None

    def acquire(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                os.close(self.fd)
                self.fd = None
                return False
            # A filesystem without flock support: carry on without (Jobs of one artifact do not overlap).
        return True

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def clean_stale(root: str, artifact_id: str) -> list[str]:
    """Remove temp dirs of earlier, dead runs of this artifact (call while holding its lock)."""
    removed: list[str] = []
    base = artifacts_root(root)
    if not base.is_dir():
        return removed
    for p in base.glob(f"{TMP_PREFIX}{artifact_id}-*"):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p.name)
    return removed


def make_temp(root: str, artifact_id: str) -> Path:
    base = artifacts_root(root)
    base.mkdir(parents=True, exist_ok=True)
    p = base / f"{TMP_PREFIX}{artifact_id}-{secrets.token_hex(4)}"
    p.mkdir()
    return p


def fsync_tree(d: Path) -> None:
    """fsync every file and directory under ``d`` (and ``d``), so the rename publishes durable contents."""
    for dirpath, _dirnames, filenames in os.walk(d):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def commit(tmp: Path, root: str, artifact_id: str) -> Path:
    """Rename ``tmp`` to the final path. Returns the final path; AlreadyPublished semantics are the caller's."""
    final = final_path(root, artifact_id)
    fsync_tree(tmp)
    try:
        os.rename(tmp, final)
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
            raise FileExistsError(str(final)) from None
        raise JobError("PublishFailed", f"rename {tmp.name} -> {final}: {exc}") from None
    _fsync_dir(final.parent)
    return final
