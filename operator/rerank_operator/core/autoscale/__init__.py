"""Metrics-driven scaling and GPU/CPU traffic shifting (issue 4).

Pure pieces the operator's timer wires together:

- ``config``      typed view of ``spec.autoscaling`` / ``spec.routing`` / pool bounds, with the CRD's defaults;
- ``signals``     per-pool load signals (what the policy sees), and their freshness;
- ``exposition``  Prometheus text-format parser and PromQL-compatible ``histogram_quantile``;
- ``direct``      the default source: scrape each ready TEI pod's ``/metrics``;
- ``prometheus``  the PromQL source (HTTP API), including optional DCGM GPU-memory signals;
- ``history``     bounded, serializable memory of past recommendations and scale/shift times;
- ``scaling``     one pool's replica arithmetic: stabilization windows, step limits, cooldowns, bounds;
- ``policy``      ``decide(...)``: THE policy, a pure function returning a ``Decision``.

Nothing here talks to the Kubernetes API; only ``direct`` and ``prometheus`` do network I/O.
"""
