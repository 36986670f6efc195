"""hack/release's pure parts: where a --registry points, and the chart values that name the pushed images."""

from __future__ import annotations

import pytest
import yaml

from rerank_devcluster import registry, release

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(("target", "host", "prefix"), [
    ("registry.example.com/platform", "registry.example.com", "platform"),
    ("registry.example.com", "registry.example.com", ""),
    ("127.0.0.1:5000/rerank/", "127.0.0.1:5000", "rerank"),
    ("localhost:5000", "localhost:5000", ""),
])
def test_a_registry_is_a_host_and_a_path(target: str, host: str, prefix: str) -> None:
    assert release.split_registry(target) == (host, prefix)


@pytest.mark.parametrize("target", ["platform", "https://registry.example.com", "registry example.com/x"])
def test_what_is_not_a_registry_is_refused(target: str) -> None:
    with pytest.raises(release.ReleaseError, match="expected host"):
        release.split_registry(target)


def test_the_released_chart_names_the_pushed_images_by_digest_and_keeps_the_rest() -> None:
    text = release.CHART.joinpath("values.yaml").read_text()
    quantizer = f"registry.example.com/platform/rerank-quantizer@{DIGEST}"
    out = release.chart_values(text, f"registry.example.com/platform/rerank-operator@{DIGEST}", quantizer)
    before, after = yaml.safe_load(text), yaml.safe_load(out)
    assert after["image"] == {**before["image"], "repository": "registry.example.com/platform/rerank-operator",
                              "digest": DIGEST}
    assert after["workloads"] == {**before["workloads"], "quantizerImage": quantizer}
    changed = {k for k in before if before[k] != after[k]}
    assert changed == {"image", "workloads"}
    assert out.count("\n#") == text.count("\n#")  # the comments users read stay


def test_a_chart_whose_values_moved_is_refused_not_released_half_pointed() -> None:
    with pytest.raises(release.ReleaseError, match="no longer has"):
        release.chart_values("image:\n  repository: x\n", f"r/o@{DIGEST}", f"r/q@{DIGEST}")


def test_the_registry_speaks_plain_http_on_loopback_only_and_never_deletes(tmp_path: object) -> None:
    config = yaml.safe_load(registry.config(tmp_path, 5005))  # type: ignore[arg-type]
    assert config["http"]["addr"] == "127.0.0.1:5005"
    assert config["storage"]["delete"] == {"enabled": False}
    hosts = registry.hosts_toml("127.0.0.1:5005")
    assert 'server = "http://127.0.0.1:5005"' in hosts and 'capabilities = ["pull", "resolve"]' in hosts
