"""rerank-sampler: copies a fraction of a model's answered /rerank requests to its quality guard, from inside the
serving pod, so that the guard's sample needs only the Gateway API's core features.

The guard (quality_guard/, a pod of its own) checks a sample of the model's live traffic. A route's ``RequestMirror``
filter could copy it, but that filter is an Extended feature: a gateway without it (Traefik) answers 500 to every
request of such a route. So the sampler runs beside TEI in each serving pod, as the port the Service sends to: a
reverse proxy that forwards every request to TEI unchanged and, after a ``POST /rerank`` was answered 2xx, queues a
copy of it for the guard (with probability ``--fraction``) which one background thread sends with the model's mirror
token. The guard being slow or down never touches serving: a full queue drops the copy, a failed send counts it.

- ``framing.py``   a request's body read whole as its client framed it (length or chunked), within TEI's limit;
- ``relay.py``     one request to TEI over a pool of keep-alive connections: end-to-end headers, no retry;
- ``sampling.py``  which answered requests are copied (an independent draw each), the bounded queue and the courier
                   thread that posts the copies to the guard with the mirror token;
- ``metrics.py``   the sampler's own /metrics page on a port of its own (TEI's /metrics is proxied), by hand;
- ``logs.py``      JSON lines, stdlib logging: start, drain, the guard becoming unreachable or reachable again;
- ``server.py``    the serving port (proxy, body framing and size, ``GET /sampler/healthz``), the metrics port,
                   draining;
- ``main.py``      the ``rerank-sampler`` command line; refuses to start without the mirror token.

Standard library only. It imports nothing of the operator, the activator, the quantizer or the guard (an
import-linter contract in pyproject.toml); it meets them in ``rerank_contracts/guard.py``.
"""
