"""The shapes of strings the operator hands on to Kubernetes or to a command line. Pure predicates.

The CRD refuses the same shapes at apply time (CEL rules in crds/rerankmodel.yaml); the operator checks again in
``spec.parse`` because an object stored before a rule existed is never re-validated, and because a string that
reaches ``rerank-quantize`` or TEI as an argument must never be readable as a flag (a leading '-') or as a way out
of a directory ('..').
"""

from __future__ import annotations

import re

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_HUB_PART = r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?"
_HUB_ID = re.compile(rf"{_HUB_PART}(/{_HUB_PART})?")
_REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*")
_VOLUME_PATH = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*")
_DOT_SEGMENT = re.compile(r"(^|/)\.\.?(/|$)")
_KEY = re.compile(r"[-._a-zA-Z0-9]+")
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]*")
_OPERATOR_TYPE = re.compile(r"[A-Z][A-Za-z0-9]*")


def dns_label(value: str) -> bool:
    """A namespace or Service name."""
    return len(value) <= 63 and bool(_DNS_LABEL.fullmatch(value))


def dns_subdomain(value: str) -> bool:
    """An object name: Secrets, ConfigMaps, claims, storage classes."""
    return len(value) <= 253 and bool(_DNS_SUBDOMAIN.fullmatch(value))


def hub_id(value: str) -> bool:
    """``org/name`` (or ``name``) as the hub accepts it; no '..' or '--', which the hub refuses."""
    return len(value) <= 200 and bool(_HUB_ID.fullmatch(value)) and ".." not in value and "--" not in value


def revision(value: str) -> bool:
    """A commit, tag or branch that cannot be read as a flag (leading '-') or a parent directory ('..')."""
    return (len(value) <= 255 and bool(_REVISION.fullmatch(value)) and ".." not in value and "//" not in value
            and not value.endswith(("/", ".")))


def volume_path(value: str) -> bool:
    """A path relative to the volume's root that stays inside it."""
    return len(value) <= 512 and bool(_VOLUME_PATH.fullmatch(value)) and not _DOT_SEGMENT.search(value)


def config_key(value: str) -> bool:
    """A key of a Secret or ConfigMap."""
    return len(value) <= 253 and bool(_KEY.fullmatch(value))


def label_key(value: str) -> bool:
    """``[prefix/]name`` with a DNS-subdomain prefix and a name of at most 63 characters."""
    prefix, _, name = value.rpartition("/")
    return (len(name) <= 63 and bool(_LABEL_NAME.fullmatch(name))
            and ((not prefix and "/" not in value) or dns_subdomain(prefix)))


def label_value(value: str) -> bool:
    return len(value) <= 63 and bool(_LABEL_VALUE.fullmatch(value))


def image(value: str) -> bool:
    """A container image reference without whitespace (the registry decides the rest)."""
    return len(value) <= 512 and bool(_IMAGE.fullmatch(value))


def operator_type(value: str) -> bool:
    """An ONNX operator type such as MatMul."""
    return len(value) <= 64 and bool(_OPERATOR_TYPE.fullmatch(value))


_QUALIFIED = re.compile(f"{_DNS_SUBDOMAIN.pattern}/{_LABEL_NAME.pattern}")  # <DNS subdomain>/<label name>


def resource_name(value: str) -> bool:
    """A resource a container may request: cpu, memory, ephemeral-storage, hugepages-<size>, or a qualified name."""
    return value in ("cpu", "memory", "ephemeral-storage") or value.startswith("hugepages-") or bool(
        _QUALIFIED.fullmatch(value))


def extended_resource(value: str) -> bool:
    """A device-plugin resource such as nvidia.com/gpu, which Kubernetes never overcommits (request == limit)."""
    return "/" in value and not value.startswith("kubernetes.io/")
