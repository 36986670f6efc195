"""Fleet benchmark: N RerankModels in M namespaces, autoscaling on, on the dev cluster (kwok nodes); prints JSON.

    .venv/bin/python -m benchmarks.fleet --models 1000 [--namespaces 100] [--metrics-source direct|prometheus]
                                         [--replicas 1|2] [--steady-window 60] [--operator-ref HEAD]
                                         [--idle [--idle-seconds 30] [--activator-hold 5]]

What it measures (progress on stderr, one JSON object on stdout):

- bring-up: N applies in a burst (``--apply-concurrency`` clients); the operator creates one quantization Job per
  model; this process finishes each quantizer pod as soon as kwok runs it, with the "published" termination message
  of the cluster tests (``rerank_devcluster.operator_process.publish_status``), and waits until every model is Ready.
  apply->Job latency is the API server's: from its audit log, the model's create received -> the operator's Job
  create answered (one clock, microseconds; ``apply_to_job_s``); ``apply_to_job_seen_here_s`` is the time this
  process saw the Job on its own watch minus the time the model's create call returned (``time.monotonic()``), which
  adds the API server's watch delivery to this process (~1.3 s in a 300-model burst on 2 cores).
- steady state: once all are Ready and the operator has made no write for ``--settle-quiet`` seconds, a window of
  ``--steady-window`` seconds: the operator's API requests by verb from the API server's audit log (the dev cluster
  logs every request of the operator's ServiceAccount; watches are counted apart: opened, by ResponseStarted), its
  CPU seconds per second and RSS from /proc/<pid>, fake TEI scrapes per second, and PromQL queries per second with
  ``--metrics-source prometheus`` (the operator's ``rerank_operator_promql_queries_total`` if it has one, else the
  Prometheus server's ``prometheus_engine_query_duration_seconds_count``).
- failover (``--replicas 2``): two operators with ``--leader-election``; the leader (gauge ``rerank_operator_leader``
  on its metrics port) is SIGKILLed, one model's spec is changed at that moment, and the time until the standby leads,
  until its counters move, and until the change reaches the model's Deployment is measured; then every model must be
  Ready with one Job per model and artifact.

- idle (``--idle``): every model may go to zero (CPU pool minReplicas 0, no GPU pool, ``idleSeconds``
  ``--idle-seconds``, an HTTPRoute to a Gateway that does not exist) and gets no request at all (the fake TEI serves
  zero counters); the cluster has the Gateway API CRDs, the operator the activator flags and rbac_activator.yaml's
  Role, and the activator runs in this process (``rerank_activator.server.start``). After the bring-up, the time
  until every CPU Deployment is at 0 replicas and no pool pod is left (``idle_after_s``, from the last model Ready),
  then the steady window above with zero pods, then ``idle_pods`` and ``models_at_zero`` (lastDecision.scaleToZero
  "asleep"); last, one model is woken by a request sent as the Gateway would (the headers of its HTTPRoute, to the
  activator): ``wake_scale_s`` from the request to its CPU Deployment at 1 replica (the operator's part of a wake).
  kwok pods serve nothing, so the held request is answered 503 once its hold (``--activator-hold``) runs out.

- shared artifacts (``--distinct-models K``): a RerankClass with an ``artifactStore`` (a real distribution registry,
  started here, and the store's namespace); model i serves hub model ``bench/reranker-<i mod K>`` with no hub token,
  so the N models ask for K artifacts. This process plays each shared Job's quantizer: it pushes a small artifact to
  the registry with the quantizer's own push code and ends the pod with the result. The first K models (one per
  artifact) are applied first and made Ready; then the other N - K in one burst, whose artifacts exist
  (``ready_after_first_burst_s``: apply -> Ready, the API server's queue of the burst included); after the steady
  window, ``--late-models`` tenants arrive one at a time (``ready_after_first_s``: the model's create call returned
  -> its Ready seen here).
  ``jobs`` counts every quantization Job in the cluster, ``artifacts`` the store's tags.

Direct metrics: kwok pods have no network, so every pool pod's /metrics is served by one local fake TEI endpoint
(``rerank_devcluster.fake_tei.SteadyTei``: constant light load) through ``rerank_devcluster.scrape_redirect``.
"""
