"""Get the model: a local directory as is, or a hub repo at a pinned revision with only the files needed."""

from __future__ import annotations

import fnmatch
import os
import time
from dataclasses import dataclass
from pathlib import Path

from quantizer_job.steps.common.errors import JobError
from quantizer_job.steps.tei.layout import TOKENIZER_FILES

WEIGHT_PATTERNS_SAFETENSORS = ("model.safetensors", "model-*.safetensors", "model.safetensors.index.json")
WEIGHT_PATTERNS_BIN = ("pytorch_model.bin", "pytorch_model-*.bin", "pytorch_model.bin.index.json")
META_PATTERNS = ("config.json", *TOKENIZER_FILES)


@dataclass
class Fetched:
    path: Path
    source: str  # "local" | "hub"
    revision: str | None  # resolved commit for hub models
    files: list[str]


def looks_like_path(model: str) -> bool:
    return model.startswith(("/", "./", "../", "~")) or os.path.isdir(model)


def choose_patterns(repo_files: list[str]) -> list[str]:
    """allow_patterns for snapshot_download: metadata + safetensors if present, else the .bin weights."""
    def present(patterns: tuple[str, ...]) -> bool:
        return any(fnmatch.fnmatch(f, p) for f in repo_files for p in patterns)

    if present(WEIGHT_PATTERNS_SAFETENSORS):
        weights = WEIGHT_PATTERNS_SAFETENSORS
    elif present(WEIGHT_PATTERNS_BIN):
        weights = WEIGHT_PATTERNS_BIN
    else:
        raise JobError("UnsupportedModel", "the repository has no model.safetensors or pytorch_model.bin weights")
    return list(META_PATTERNS) + list(weights)


def fetch(model: str, revision: str | None, dest: Path, retries: int = 4) -> Fetched:
    if looks_like_path(model):
        p = Path(model).expanduser()
        if not p.is_dir():
            raise JobError("ModelNotFound", f"local model directory {p} does not exist")
        if not (p / "config.json").is_file():
            raise JobError("ModelNotFound", f"{p} has no config.json")
        return Fetched(path=p, source="local", revision=None, files=sorted(x.name for x in p.iterdir()))
    return _fetch_hub(model, revision, dest, retries)


#: HTTP statuses that say the hub (or the mirror or proxy in front of it) is down or busy, not that the model is
#: wrong: the Job ends HubUnavailable and the operator retries with a new Job after a backoff.
TRANSIENT_STATUSES = (408, 429, 500, 502, 503, 504)


def hub_endpoint() -> str:
    """The hub the Job downloads from: ``HF_ENDPOINT`` (the class's ``modelSources.hub.endpoint``, a mirror) or
    huggingface.co."""
    return os.environ.get("HF_ENDPOINT") or "https://huggingface.co"


def unavailable(exc: BaseException) -> bool:
    """Whether a failed hub call says the hub is unreachable or failing (retry later) rather than that the request
    is wrong (401/403/404: permanent). Connection errors, timeouts and a missing local cache entry (how
    huggingface_hub reports an unreachable hub while downloading) count as unreachable."""
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(status, int):
        return status in TRANSIENT_STATUSES
    return True


def _fetch_hub(repo_id: str, revision: str | None, dest: Path, retries: int) -> Fetched:
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    token = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN") or None
    api = HfApi(endpoint=hub_endpoint(), token=token)
    delay = 2.0
    last: Exception | None = None
    for attempt in range(1, retries + 1):
        try:
            info = api.model_info(repo_id, revision=revision or "main", files_metadata=False)
            files = [s.rfilename for s in info.siblings or []]
            patterns = choose_patterns(files)
            # Pin to the resolved commit so every file comes from the same revision.
            path = snapshot_download(repo_id, revision=info.sha, token=token, allow_patterns=patterns,
                                     local_dir=str(dest), endpoint=hub_endpoint())
            got = sorted(p.name for p in Path(path).iterdir() if p.is_file())
            return Fetched(path=Path(path), source="hub", revision=info.sha, files=got)
        except GatedRepoError:
            raise JobError("ModelNotFound", f"{repo_id} is gated: accept its terms on the hub and give the Job an "
                                            "HF_TOKEN of an account that has access") from None
        except RevisionNotFoundError:
            raise JobError("ModelNotFound", f"revision {revision!r} does not exist in {repo_id}") from None
        except RepositoryNotFoundError:
            raise JobError("ModelNotFound", f"{repo_id} does not exist on {hub_endpoint()}, or is private and "
                                            "HF_TOKEN is missing or lacks access") from None
        except EntryNotFoundError as exc:
            raise JobError("ModelNotFound", f"{repo_id}: a file is missing: {exc}") from None
        except JobError:
            raise
        except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as exc:
            status = getattr(getattr(exc, "response", None), "status_code", None)
            if status in (401, 403):
                raise JobError("ModelNotFound", f"{repo_id}: access denied ({status}); check HF_TOKEN") from None
            if not unavailable(exc):
                raise JobError("ModelNotFound", f"{repo_id}: {hub_endpoint()} answered {status}: {exc}"[:1000]
                               ) from None
            last = exc
            if attempt < retries:
                time.sleep(delay)
                delay *= 2
    raise JobError("HubUnavailable", f"{hub_endpoint()} did not answer for {repo_id} after {retries} attempts "
                                     f"({type(last).__name__}: {last}); the operator retries with a new Job"[:1000])
