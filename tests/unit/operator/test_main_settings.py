"""main.py's flags reach the handlers as one typed Settings (handlers.install), never through the environment."""

from __future__ import annotations

import os

import pytest

from rerank_operator import main
from rerank_operator.controllers import handlers
from rerank_operator.core.autoscale.config import PrometheusSettings
from rerank_operator.core.leadership import LeaderElectionSettings
from rerank_operator.core.settings import DEFAULT_OPERATOR_POD_LABELS, Settings


def test_flags_and_the_pods_identity_become_settings() -> None:
    args = main.parse_args(["--resync-seconds", "7.5", "--watch-server-timeout", "20",
                            "--prometheus-url", "http://p.monitoring:9090",
                            "--prometheus-gpu-memory-total-query", "sum(total)"])
    env = {"POD_NAMESPACE": "rerank-system", "RERANK_OPERATOR_POD_LABELS": "app=op, tier = control"}
    assert main.settings_from(args, env) == Settings(
        operator_namespace="rerank-system", operator_pod_labels={"app": "op", "tier": "control"},
        prometheus=PrometheusSettings(url="http://p.monitoring:9090", gpu_memory_total_query="sum(total)"),
        resync_seconds=7.5, watch_server_timeout=20)


def test_defaults_without_flags_or_a_pod() -> None:
    settings = main.settings_from(main.parse_args([]), {})
    assert settings == Settings() and settings.operator_pod_labels == DEFAULT_OPERATOR_POD_LABELS
    assert settings.resync_seconds == 300.0 and settings.watch_server_timeout is None
    assert settings.leader_election == LeaderElectionSettings() and not settings.leader_election.enabled


def test_leader_election_flags_and_the_pods_namespace() -> None:
    args = main.parse_args(["--leader-election", "--leader-election-id", "rr-rerank-operator",
                            "--leader-election-lease-seconds", "15", "--leader-election-renew-seconds", "10",
                            "--leader-election-retry-seconds", "3"])
    assert main.settings_from(args, {"POD_NAMESPACE": "rerank-system"}).leader_election == LeaderElectionSettings(
        enabled=True, namespace="rerank-system", name="rr-rerank-operator", lease_duration_seconds=15,
        renew_deadline_seconds=10, retry_period_seconds=3)
    # The flag's namespace wins over the pod's; defaults: the Lease "rerank-operator", 10/7/2 s.
    args = main.parse_args(["--leader-election", "--leader-election-namespace", "elsewhere"])
    assert main.settings_from(args, {"POD_NAMESPACE": "rerank-system"}).leader_election == LeaderElectionSettings(
        enabled=True, namespace="elsewhere")


def test_leader_election_without_a_namespace_refuses_to_start() -> None:
    with pytest.raises(SystemExit, match="--leader-election needs the Lease's namespace"):
        main.settings_from(main.parse_args(["--leader-election"]), {})
    with pytest.raises(SystemExit, match=r"renew deadline .* must be shorter than the lease duration"):
        main.settings_from(main.parse_args(["--leader-election", "--leader-election-renew-seconds", "10"]),
                           {"POD_NAMESPACE": "ns"})
    # Off (a process on a workstation): no namespace needed, nothing elected.
    assert not main.settings_from(main.parse_args([]), {}).leader_election.enabled


def test_install_registers_every_handler_with_the_settings_it_was_given() -> None:
    before = dict(os.environ)
    registry = handlers.install(Settings(resync_seconds=7.5), ["team-a"])
    assert dict(os.environ) == before  # nothing is handed over through the environment
    # No timers, daemons or change handlers: kopf keeps no finalizer and writes nothing; kopf does not watch the
    # models at all (their informer does, adapters/caches.py); every trigger is a key in the reconcile queue, and the
    # resync is the queue's own delayed add.
    assert list(registry._spawning.get_all_handlers()) == []
    assert list(registry._changing.get_all_handlers()) == []
    assert sorted(h.id for h in registry._watching.get_all_handlers()) == ["on_class_event"]
    assert sorted(h.id for h in registry._activities.get_all_handlers()) == ["cleanup", "configure",
                                                                             "login_via_client", "reconciling"]


def test_peer_identity_never_needs_a_user_name() -> None:
    # A pod's uid (65532, or OpenShift's random one) has no passwd entry: kopf's own guess crashed on it.
    assert main.peer_identity({"POD_NAME": "op-7d9-x2"}, "host", 12) == "op-7d9-x2"
    assert main.peer_identity({}, "host", 12) == "host/12"



def test_the_platforms_workload_flags_become_settings_and_bad_ones_refuse_to_start() -> None:
    args = main.parse_args(["--quantizer-image", "registry.example.com/rq@sha256:" + "0" * 64,
                            "--image-pull-secret", "regcred", "--image-pull-secret", "mirror"])
    settings = main.settings_from(args, {})
    assert settings.quantizer_image == "registry.example.com/rq@sha256:" + "0" * 64
    assert settings.image_pull_secrets == ("regcred", "mirror")
    assert main.settings_from(main.parse_args([]), {}).quantizer_image is None
    with pytest.raises(SystemExit, match="--quantizer-image '--pull' is not an image reference"):
        main.settings_from(main.parse_args(["--quantizer-image=--pull"]), {})
    with pytest.raises(SystemExit, match="--image-pull-secret 'Reg_Cred' is not a Secret name"):
        main.settings_from(main.parse_args(["--image-pull-secret", "Reg_Cred"]), {})
