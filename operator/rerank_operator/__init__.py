"""rerank-operator: a RerankModel becomes a quantization Job, a CPU-INT8 and a GPU-FP16 TEI pool, and routing.

Layers: ``spec`` (typed view) -> pure builders (``storage``, ``job``, ``deployment``, ``service``, ``routing``)
-> ``plan`` -> ``apply`` (the only API client) -> ``status``/``events``; ``reconcile`` sequences them and
``handlers`` wires kopf. ``autoscale`` is the metrics-driven policy.
"""
