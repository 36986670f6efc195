"""adapters/artifact_store.py against a real registry: what a reconcile sees of a store, what it is told when the
store does not answer, and what the collector deletes (never an artifact a reconcile just asked for)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rerank_contracts import oci, shared_store
from rerank_devcluster.operator_process import shared_artifact
from rerank_devcluster.processes import free_port
from rerank_devcluster.registry import LocalRegistry, standalone
from rerank_operator.adapters.artifact_store import SharedArtifacts
from rerank_operator.core import platform

REPO = "rerank/artifacts"


class NoJobs:
    """The API client's two calls the adapter makes, answering as an API server with no shared Job would."""

    def __init__(self) -> None:
        self.lists = 0

    def list_objects(self, api_version: str, kind: str, namespace: str, selector: str) -> list[Any]:
        self.lists += 1
        return []


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRegistry]:
    with standalone(tmp_path_factory.mktemp("store"), delete=True) as running:
        yield running


def push(registry: LocalRegistry, tmp: Path, artifact_id: str, repo: str = REPO) -> str:
    return shared_store.push(shared_artifact(tmp, artifact_id), repo, artifact_id,
                      registry=oci.Registry(registry.host, insecure=True), scratch=tmp / "scratch")


def where(registry: LocalRegistry, grace: int = 0, repo: str = REPO) -> platform.ArtifactStore:
    return platform.ArtifactStore(f"{registry.host}/{repo}", "rerank-artifacts", insecure=True,
                                 unused_grace_seconds=grace)


def test_a_published_artifact_is_seen_with_its_checksum_and_parts(registry: LocalRegistry, tmp_path: Path) -> None:
    ref = push(registry, tmp_path, "a0")
    client = NoJobs()
    seen = SharedArtifacts(client).view(where(registry), "a0")  # type: ignore[arg-type]
    assert seen.published is not None and seen.published.ref == ref
    manifest = tmp_path / "artifacts" / "a0" / "manifest.json"
    assert seen.published.manifest_sha256 == oci.sha256_file(manifest)
    assert seen.published.parts == ("cpu-int8", "original") and seen.published.manifest["artifact_id"] == "a0"
    assert client.lists == 0, "a published artifact needs no look at the Jobs"
    absent = SharedArtifacts(client).view(where(registry), "nothing")  # type: ignore[arg-type]
    assert absent.published is None and absent.unavailable == "" and client.lists == 1


def test_a_store_that_does_not_answer_is_said_not_raised_and_not_cached() -> None:
    down = platform.ArtifactStore(f"127.0.0.1:{free_port()}/{REPO}", "rerank-artifacts", insecure=True)
    shared = SharedArtifacts(NoJobs())  # type: ignore[arg-type]
    first = shared.view(down, "a1")
    assert first.published is None and first.unavailable and first.jobs == ()
    assert shared.view(down, "a1") is not first, "asked again, not served from the cache"


def test_the_collector_deletes_only_what_nobody_uses_or_just_asked_for(registry: LocalRegistry,
                                                                         tmp_path: Path) -> None:
    repo = "rerank/collected"  # a store of this test's own
    for artifact_id in ("used", "asked", "unused"):
        push(registry, tmp_path, artifact_id, repo)
    clock = [1000.0]
    shared = SharedArtifacts(NoJobs(), clock=lambda: clock[0])  # type: ignore[arg-type]
    store_ = where(registry, grace=0, repo=repo)
    shared.view(store_, "asked")  # a reconcile's lookup: its model's status is not written yet
    deleted = shared.collect([store_], [{"artifact": {"id": "used"}}], now=5000.0)
    reg = oci.Registry(registry.host, insecure=True)
    assert deleted == [f"{store_.repository}:unused"]
    assert reg.resolve(repo, "unused") is None and reg.resolve(repo, "used") and reg.resolve(repo, "asked")
    clock[0] += 31  # long after the lookup, and still nobody serves it
    assert shared.collect([store_], [{"artifact": {"id": "used"}}], now=6000.0) == [f"{store_.repository}:asked"]


def test_the_collectors_deletes_stop_when_this_replica_no_longer_leads(registry: LocalRegistry,
                                                                          tmp_path: Path) -> None:
    """A registry delete is not fenced by the Lease as an API write is: the collector asks before each one."""
    repo = "rerank/fenced"
    for artifact_id in ("old1", "old2", "old3"):
        push(registry, tmp_path, artifact_id, repo)
    shared = SharedArtifacts(NoJobs(), clock=lambda: 1000.0)  # type: ignore[arg-type]
    store_ = where(registry, grace=0, repo=repo)
    term = iter([True, False])  # the Lease lost during the pass, after the first delete
    deleted = shared.collect([store_], [], now=5000.0, leading=lambda: next(term, False))
    reg = oci.Registry(registry.host, insecure=True)
    assert len(deleted) == 1
    assert sum(reg.resolve(repo, t) is not None for t in ("old1", "old2", "old3")) == 2
    assert shared.collect([store_], [], now=5000.0, leading=lambda: False) == []


def test_a_retagged_artifact_is_refused(registry: LocalRegistry, tmp_path: Path) -> None:
    """Whoever can write the registry tags another artifact's manifest with this id: its files would verify (they
    are that other artifact's), so the operator checks the artifact a tag holds is the one its name says, and reads
    a mismatch as unpublished (the shared Job then builds and pushes the real one)."""
    push(registry, tmp_path, "real0")
    store = oci.Registry(registry.host, insecure=True)
    body, _, media_type = store.get_manifest(REPO, "real0")
    store.put_manifest(REPO, "victim0", body, media_type)  # the re-tag: same bytes, another id
    client = NoJobs()
    seen = SharedArtifacts(client).view(where(registry), "victim0")  # type: ignore[arg-type]
    assert seen.published is None and seen.unavailable == ""
    assert client.lists == 1, "read as unpublished: the shared Job's state is looked at"
    assert SharedArtifacts(NoJobs()).view(where(registry), "real0").published is not None  # type: ignore[arg-type]
