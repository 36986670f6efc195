"""The pieces benchmarks/fleet and the cluster tests share, without a cluster: the scrape redirect's address table,
the fake TEI endpoint and its traffic loop, the quantizer's "published" status patch, and the benchmark's audit and
target arithmetic."""

from __future__ import annotations

import json
import os
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.fleet.audit import AuditTail, apply_to_job_from_audit, summarize_requests
from benchmarks.fleet.cli import parse_args
from benchmarks.fleet.manifests import model_manifest
from benchmarks.fleet.report import quantiles, targets
from benchmarks.fleet.scale_to_zero import route_backends, route_headers
from benchmarks.fleet.watches import zero_phase
from rerank_devcluster import operator_process as op
from rerank_devcluster.fake_tei import MetricsServer, SteadyTei, TeiCounters, TrafficLoop
from rerank_devcluster.scrape_redirect import ANY_POD, publish, redirected
from rerank_operator.adapters import tei_scrape


def target(name: str) -> tei_scrape.PodTarget:
    return tei_scrape.PodTarget(name=name, pool="cpu", ip="10.244.0.7", port=8080)


def test_redirect_names_then_any_then_the_pods_own_address(tmp_path: Path) -> None:
    table = tmp_path / "addresses.json"
    address = redirected(str(table))
    assert address(target("a")) == "10.244.0.7:8080"  # no file yet
    table.write_text(json.dumps({"a": "127.0.0.1:1"}))
    assert address(target("a")) == "127.0.0.1:1"
    assert address(target("b")) == "10.244.0.7:8080"
    table.write_text(json.dumps({"a": "127.0.0.1:1", ANY_POD: "127.0.0.1:9"}))
    os.utime(table, ns=(1, 10**18))  # a rewrite is seen even when the size stays the same
    assert address(target("b")) == "127.0.0.1:9"
    table.write_text("{not json")
    assert address(target("a")) == "10.244.0.7:8080"  # half-written: this scrape uses the pod's own address


def test_published_table_is_read_whole_and_leaves_no_partial_file(tmp_path: Path) -> None:
    table = tmp_path / "addresses.json"
    address = redirected(str(table))
    publish(table, {"a": "127.0.0.1:1"})
    assert address(target("a")) == "127.0.0.1:1"
    publish(table, {"a": "127.0.0.1:2", ANY_POD: "127.0.0.1:9"})
    os.utime(table, ns=(1, 10**18))
    assert (address(target("a")), address(target("b"))) == ("127.0.0.1:2", "127.0.0.1:9")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["addresses.json"]


class BlockingLoop(TrafficLoop):
    """A loop whose refresh waits until the test lets it go, counting how many run at once."""

    def __init__(self) -> None:
        super().__init__(rate=0.0)
        self.entered = threading.Semaphore(0)
        self.release = threading.Event()
        self.running = self.most = self.calls = 0
        self.count = threading.Lock()

    def refresh(self) -> None:
        with self.count:
            self.running, self.calls = self.running + 1, self.calls + 1
            self.most = max(self.most, self.running)
        self.entered.release()
        self.release.wait(10)
        with self.count:
            self.running -= 1

    def step_pod(self, name: str, rate: float, dt: float) -> None:
        pass


def test_a_tests_refresh_waits_for_the_loops_own() -> None:
    """The cluster tests' fleets rewrite the address tables in refresh; the loop's thread refreshes every second and a
    test asks for one at once (look_again): the two must never run together."""
    loop = BlockingLoop()
    first = threading.Thread(target=loop.look_again)  # stands for the loop's own refresh, held inside
    first.start()
    assert loop.entered.acquire(timeout=5)
    second = threading.Thread(target=loop.look_again)
    second.start()
    assert not loop.entered.acquire(timeout=0.3)  # the second waits outside
    loop.release.set()
    assert loop.entered.acquire(timeout=5)
    first.join(5)
    second.join(5)
    assert (loop.calls, loop.most) == (2, 1)


def test_fake_tei_serves_steady_counters_and_503_when_down() -> None:
    clock = [100.0]
    tei = SteadyTei(rate=2.0, latency=0.03, clock=lambda: clock[0])
    server = MetricsServer(tei.render)
    try:
        clock[0] = 110.0
        with urllib.request.urlopen(f"http://{server.address}/metrics", timeout=5) as resp:
            values = op.parse_exposition(resp.read().decode())
        assert values['te_request_count{method="batch"}'] == 20.0
        assert values['te_request_duration_bucket{le="0.05"}'] == 20.0
        assert values['te_request_duration_bucket{le="0.025"}'] == 0.0
        tei.up = False
        try:
            urllib.request.urlopen(f"http://{server.address}/metrics", timeout=5)
            raise AssertionError("expected 503")
        except urllib.error.HTTPError as exc:
            assert exc.code == 503
        assert server.requests == 2
    finally:
        server.stop()


def test_tei_counters_queue_what_capacity_cannot_serve() -> None:
    pod = TeiCounters(capacity=10.0, base_latency=0.03, max_backlog=5.0)
    pod.step(rate=20.0, dt=1.0)
    assert (pod.requests, pod.success, pod.backlog, pod.failure) == (20.0, 10.0, 5.0, 5.0)
    assert "te_queue_size 5.0" in pod.render()


def test_publish_status_carries_the_contracts_message() -> None:
    pod: dict[str, Any] = {"metadata": {"labels": {op.ARTIFACT_LABEL: "abc123"}},
                           "spec": {"containers": [{"name": "quantize", "image": "q:1"}]}}
    status = op.publish_status(pod)["status"]
    assert status["phase"] == "Succeeded"
    terminated = status["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 0 and json.loads(terminated["message"])["artifact_id"] == "abc123"


def test_audit_summary_counts_the_operators_requests_by_verb_and_watches_apart() -> None:

    def event(verb: str, stage: str = "ResponseComplete", user: str = op.OPERATOR_USER,
              resource: str = "rerankmodels") -> dict[str, Any]:
        return {"verb": verb, "stage": stage, "user": {"username": user}, "objectRef": {"resource": resource}}

    events = [event("get"), event("get"), event("list"), event("patch", resource="rerankmodels"),
              event("watch", "ResponseStarted"), event("watch"), event("create", user="system:admin"),
              event("update", resource="leases"), event("get", resource="leases")]
    summary = summarize_requests(events, seconds=2.0)
    assert summary["by_verb_per_s"] == {"get": 1.5, "list": 0.5, "patch": 0.5, "update": 0.5}
    assert (summary["writes"], summary["lease_writes"]) == (1, 1)  # leader election's renewals apart
    assert (summary["watches_opened"], summary["watches_completed"]) == (1, 1)
    assert summary["requests_per_s"] == 3.5  # 6 requests and 1 watch opened, in 2 s


def test_targets_pass_fail_and_not_measured() -> None:
    args = parse_args(["--models", "10"])
    result = {"bring_up": {"all_ready": True, "all_ready_after_jobs_finished_s": 5.0,
                           "apply_to_job_s": {"p95": 4.0}},
              "steady_state": {"leader": "replica-0", "operator_requests": {"requests_per_s": 3.0, "writes": 0},
                               "operator_rss_mb": {"replica-0": {"max": 120.0}},
                               "operator_cpu_cores": {"replica-0": 0.1}, "promql": {}}}
    out = targets(result, args)
    assert out["ready_after_jobs_finished_s"]["pass"] is True
    assert out["apply_to_job_p95_s"]["pass"] is False
    assert out["steady_writes"]["pass"] is True
    assert out["failover_s"]["pass"] is None and out["promql_queries_per_signal_per_tick"]["pass"] is None
    assert args.namespaces == 1
    assert args.settle_quiet == 2 * 15 + 5  # past the quiet between a model's priming scrape and its first decision
    assert quantiles([1.0, 2.0, 3.0, 4.0])["p50"] == 2.0


def test_audit_tail_follows_a_rotation(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    log.write_text(json.dumps({"verb": "get", "n": 0}) + "\n")
    tail = AuditTail(log)
    start = tail.position()
    with log.open("a") as f:
        f.write(json.dumps({"verb": "get", "n": 1}) + "\n")
    log.rename(tmp_path / "audit-2026-12-02T10-00-00.000.log")  # what the API server's rotation does
    log.write_text(json.dumps({"verb": "list", "n": 2}) + "\n")
    assert [e["n"] for e in tail.events(start, tail.position())] == [1, 2]


def test_apply_to_job_is_read_on_the_api_servers_clock() -> None:
    """From the model's create received to the operator's first Job answered; other users' Jobs, failed creates,
    other namespaces and models without a Job count for nothing."""

    def create(resource: str, ns: str, name: str, received: str, done: str, user: str = "system:admin",
               code: int = 201) -> dict[str, Any]:
        return {"stage": "ResponseComplete", "verb": "create", "user": {"username": user},
                "objectRef": {"resource": resource, "namespace": ns, "name": name}, "responseStatus": {"code": code},
                "requestReceivedTimestamp": received, "stageTimestamp": done}

    t = "2026-12-03T10:00:0{}.{}Z".format
    events = [
        create(op.PLURAL, "fleet-0001", "m-00001", t(0, "100000"), t(0, "120000")),
        create(op.PLURAL, "fleet-0001", "m-00002", t(0, "200000"), t(0, "210000")),
        create(op.PLURAL, "other", "m-00003", t(0, "200000"), t(0, "210000")),
        create("jobs", "fleet-0001", "m-00001-q-abcdef12-1", t(1, "000000"), t(1, "350000"), code=409,
               user=op.OPERATOR_USER),
        create("jobs", "fleet-0001", "m-00001-q-abcdef12-1", t(1, "400000"), t(1, "600000"), user=op.OPERATOR_USER),
        create("jobs", "fleet-0001", "m-00001-q-abcdef12-2", t(3, "000000"), t(3, "100000"), user=op.OPERATOR_USER),
        create("jobs", "fleet-0001", "m-00002-q-abcdef12-1", t(2, "000000"), t(2, "100000")),  # not the operator's
        create("jobs", "other", "m-00003-q-abcdef12-1", t(2, "000000"), t(2, "100000"), user=op.OPERATOR_USER),
    ]
    got = apply_to_job_from_audit(events)
    assert got.keys() == {("fleet-0001", "m-00001")}
    assert abs(got[("fleet-0001", "m-00001")] - 1.5) < 1e-6


def test_idle_models_may_go_to_zero_and_the_targets_count_their_pods() -> None:
    """--idle: the model may sleep (CPU pool from 0, no GPU pool, idleSeconds, a Gateway route); idle_pods is a
    target only then, and not measured there is a failure."""
    args = parse_args(["--models", "10", "--idle", "--idle-seconds", "45"])
    spec = model_manifest("m-00000", "fleet-0000", args)["spec"]
    assert spec["pools"] == {"cpu": {"minReplicas": 0, "maxReplicas": 4}, "gpu": {"enabled": False}}
    assert spec["autoscaling"]["enabled"] is True and spec["autoscaling"]["idleSeconds"] == 45
    assert spec["routing"]["gateway"]["parentRefs"]
    assert targets({"idle": {"idle_pods": 0}}, args)["idle_pods"]["pass"] is True
    assert targets({"idle": {"idle_pods": 3}}, args)["idle_pods"]["pass"] is False
    assert targets({}, args)["idle_pods"]["pass"] is False
    awake = parse_args(["--models", "10"])
    assert "idleSeconds" not in model_manifest("m-00000", "fleet-0000", awake)["spec"]["autoscaling"]
    assert targets({}, awake)["idle_pods"]["pass"] is None


def test_route_headers_backends_and_phase_are_read_as_the_gateway_and_the_status_say() -> None:
    route = {"spec": {"rules": [{
        "backendRefs": [{"group": "", "kind": "Service", "name": "rerank-activator", "namespace": "rerank-system"}],
        "filters": [{"type": "RequestHeaderModifier",
                     "requestHeaderModifier": {"set": [{"name": "X-A", "value": "1"}, {"name": "X-B", "value": "2"}]}}],
    }]}}
    assert route_backends(route) == [("rerank-system", "rerank-activator")]
    assert route_headers(route) == {"X-A": "1", "X-B": "2"}
    assert route_backends({}) == [] and route_headers({}) == {}
    assert zero_phase({"status": {"autoscaling": {"lastDecision": {"scaleToZero": "asleep"}}}}) == "asleep"
    assert zero_phase({"status": {}}) is None
