"""rerank-activator: holds the requests of a RerankModel scaled to zero until its pool answers (issue 45).

One activator serves every sleeping model of the cluster; the chart deploys it in the operator's namespace, from the
operator's image. While a model is at zero pods its HTTPRoute points here, signed (:mod:`.contract`); the activator
holds each request, lists the model on ``GET /pending`` for the operator (which scales the pool up), and forwards the
request as soon as the pool's Service accepts connections, or answers 503 after the hold.

- ``contract.py``  the headers, port, labels and HMAC tokens the operator and the activator share (stdlib only);
- ``hold.py``      who is waiting (``/pending``) and one request's hold: connect when the pool wakes, or time out;
- ``relay.py``     one exchange with the upstream over a connected socket: end-to-end headers, body, the answer;
- ``metrics.py``   the ``/metrics`` page (no tenant in any label);
- ``logs.py``      one JSON line per held request, stdlib logging;
- ``server.py``    the HTTP front: routes, authentication, body and connection limits, draining;
- ``main.py``      the ``rerank-activator`` command line.

It imports nothing of the operator, the quantizer or the guard (an import-linter contract in pyproject.toml).
"""
