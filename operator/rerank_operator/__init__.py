"""rerank-operator: a RerankModel becomes a quantization Job, a CPU-INT8 and a GPU-FP16 TEI pool, and routing.

The folders are the layers (docs/architecture.md has the module map; import-linter contracts in pyproject.toml and
tests/unit/project/test_layers.py enforce the direction):

- ``core/``         pure: the spec, the builders of every child, the plan, status, conditions, and the two pure
                    cores of policy, ``core/autoscale/`` (scaling and the traffic split) and ``core/tenancy/``
                    (RerankClasses); plain data in, plain data out, no I/O;
- ``adapters/``     I/O: the Kubernetes API (``kube_api``, ``cluster``), the TEI pods' and Prometheus' metrics
                    (``tei_scrape``, ``prometheus_api``), the operator's own metrics;
- ``controllers/``  the loops: kopf's handlers, the reconcile loop, the autoscale loop and their hand-off;
- ``main.py``       the process: flags, kopf, health and metrics ports.
"""

__version__ = "0.1.0"  # the one version: pyproject.toml reads it; tests/unit/project/test_version.py checks the copies
