"""The activator's contract with the operator (rerank_activator/activator.py): tokens, upstreams, the key file."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

import pytest

from rerank_contracts import activator

KEY = b"0123456789abcdef0123456789abcdef-and-more"


def test_tokens_are_hmac_sha256_of_the_documented_messages() -> None:
    upstream = "http://m1-cpu.tenant-a.svc:8080"
    by_hand = hmac.new(KEY, b"tenant-a/m1\nhttp://m1-cpu.tenant-a.svc:8080", hashlib.sha256).hexdigest()
    assert activator.token(KEY, "tenant-a/m1", upstream) == by_hand
    assert activator.pending_token(KEY) == hmac.new(KEY, b"pending", hashlib.sha256).hexdigest()
    assert len(by_hand) == 64 and activator.token(b"x" * 40, "tenant-a/m1", upstream) != by_hand
    # The separator keeps the pair unambiguous: moving the boundary changes the token.
    assert activator.token(KEY, "tenant-a/m1", upstream) != activator.token(KEY, "tenant-a/m1\nhttp:", "//m1")


@pytest.mark.parametrize(("model", "upstream"), [
    ("tenant-a/m1", "http://m1-cpu.tenant-a.svc:8080"),
    ("tenant-a/m1", "http://m1-cpu.tenant-a.svc.cluster.local:8080"),
    ("t/m.v2", "http://x.t.svc:1"),
    ("a" * 63 + "/m", f"http://s.{'a' * 63}.svc:65535"),
])
def test_upstreams_in_the_models_namespace_are_allowed(model: str, upstream: str) -> None:
    assert activator.upstream_allowed(model, upstream)


@pytest.mark.parametrize(("model", "upstream"), [
    ("tenant-a/m1", "http://m1-cpu.tenant-b.svc:8080"),          # another tenant's Service
    ("tenant-a/m1", "http://m1-cpu.tenant-a.svc:8080/"),         # a path
    ("tenant-a/m1", "http://m1-cpu.tenant-a.svc:8080/rerank"),
    ("tenant-a/m1", "http://m1-cpu.tenant-a.svc:8080?x=1"),      # a query
    ("tenant-a/m1", "http://m1-cpu.tenant-a.svc:8080#f"),
    ("tenant-a/m1", "http://u:p@m1-cpu.tenant-a.svc:8080"),      # user info
    ("tenant-a/m1", "https://m1-cpu.tenant-a.svc:8080"),         # the pools speak plain HTTP in the cluster
    ("tenant-a/m1", "http://m1-cpu.tenant-a.svc"),               # no port
    ("tenant-a/m1", "http://m1-cpu.tenant-a.svc:0"),
    ("tenant-a/m1", "http://m1-cpu.tenant-a.svc:65536"),
    ("tenant-a/m1", "http://m1-cpu.tenant-a.svc:08080"),
    ("tenant-a/m1", "http://m1-cpu.tenant-a.svc.evil.example:8080"),
    ("tenant-a/m1", "http://kubernetes.default.svc:443"),        # the API server
    ("tenant-a/m1", "http://10.0.0.1:8080"),                     # an address
    ("tenant-a/m1", "http://M1-cpu.tenant-a.svc:8080"),          # not a DNS label
    ("tenant-a/m1", "http://1m-cpu.tenant-a.svc:8080"),          # a Service name starts with a letter
    ("tenant-a/m1", "http://m1-cpu.tenant-a.svc:8080\n"),
    ("tenant-a/m1", " http://m1-cpu.tenant-a.svc:8080"),
    ("tenant-a", "http://m1-cpu.tenant-a.svc:8080"),             # the model without its namespace
    ("tenant-a/m1/x", "http://m1-cpu.tenant-a.svc:8080"),
    ("Tenant-A/m1", "http://m1-cpu.tenant-a.svc:8080"),
    ("tenant-a/", "http://m1-cpu.tenant-a.svc:8080"),
    ("a" * 64 + "/m", f"http://s.{'a' * 64}.svc:80"),            # a namespace is at most 63 characters
])
def test_anything_else_is_refused(model: str, upstream: str) -> None:
    assert not activator.upstream_allowed(model, upstream)


def test_upstream_address_splits_only_what_is_allowed() -> None:
    assert activator.upstream_address("http://m1-cpu.tenant-a.svc:8080") == ("m1-cpu.tenant-a.svc", 8080)
    assert activator.upstream_service("http://m1-cpu.tenant-a.svc.cluster.local:8080") == ("tenant-a", "m1-cpu", 8080)
    for split in (activator.upstream_address, activator.upstream_service):
        with pytest.raises(ValueError, match="not an activator upstream"):
            split("http://10.0.0.1:8080")


def test_the_key_is_the_files_content_stripped_and_long_enough(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_bytes(b"  " + b"k" * 48 + b"\n")
    assert activator.read_key(str(path)) == b"k" * 48
    path.write_bytes(b"\n")
    with pytest.raises(ValueError, match="empty"):
        activator.read_key(str(path))
    path.write_bytes(b"k" * 31 + b"\n")
    with pytest.raises(ValueError, match="31 bytes"):
        activator.read_key(str(path))
    path.write_bytes(b"k" * 32)
    assert len(activator.read_key(str(path))) == 32
    with pytest.raises(FileNotFoundError):
        activator.read_key(str(tmp_path / "missing"))


def test_the_chart_and_the_operator_agree_on_these_values() -> None:
    """The values other parts of the system spell again (the chart's templates, the operator's flags)."""
    assert activator.PORT == 8080 and activator.PENDING_PATH == "/pending"
    assert activator.KEY_FILE == "/var/run/rerank-activator/key"
    assert activator.POD_LABELS == {"app.kubernetes.io/component": "rerank-activator"}


def test_keys_one_a_line_the_first_signs(tmp_path: Path) -> None:
    """Rotation: the new key on the line before the old one; both verify, the new one signs."""
    path = tmp_path / "key"
    new, old = b"n" * 48, b"o" * 48
    path.write_bytes(new + b"\n" + old + b"\n\n")
    assert activator.read_keys(str(path)) == (new, old) and activator.read_key(str(path)) == new
    path.write_bytes(new + b"\nshort\n")
    with pytest.raises(ValueError, match=r"line 2\) is 5 bytes"):
        activator.read_keys(str(path))
