"""What a model's gateway supports, and what it says of the model's route. Pure.

A Gateway API implementation publishes the features it supports in its GatewayClass's ``status.supportedFeatures``
(GEP-2162; a list of ``{name: ...}`` since v1.2, of plain strings before). The operator writes only Core features
into a route unless the gateway says it supports more: an implementation that does not support an Extended filter
may accept the route and answer every request with a 500 (Traefik v3 does, for RequestMirror), so "supported" is
never guessed. Where a GatewayClass publishes no list, the class's ``qualityGuard.sampling`` decides, and its
default (``Auto``) assumes nothing.

Features the operator may use:

- weights on backendRefs and RequestHeaderModifier: Core, every conformant gateway;
- ``HTTPRouteRequestMirror`` with ``HTTPRouteRequestPercentageMirror`` (Extended): the quality guard's copy of a
  fraction of the live requests; without both the copy is made by a sampler beside TEI in the pool pods
  (``guard_policy.sample_source``);
- ``HTTPRouteRequestTimeout`` (Extended): the route's timeout while the activator holds a sleeping model's requests;
  without it the route carries none and the gateway's own default applies.

The route's own status says whether each parent Gateway accepted it (``Accepted``) and could resolve its backends
(``ResolvedRefs``): :func:`route_verdict` turns that into the model's ``RouteAccepted`` condition.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rerank_operator.core.status import conditions

REQUEST_MIRROR = "HTTPRouteRequestMirror"
#: The mirror's ``fraction`` (the guard's sample): a gateway that mirrors but lacks it would copy every request.
REQUEST_PERCENTAGE_MIRROR = "HTTPRouteRequestPercentageMirror"
REQUEST_TIMEOUT = "HTTPRouteRequestTimeout"


@dataclass(frozen=True)
class GatewayView:
    """One parent Gateway of a model's route as the operator found it: its class and that class's published
    features (None: the class publishes no list, or the Gateway or its class was not found)."""

    namespace: str
    name: str
    class_name: str | None = None
    features: frozenset[str] | None = None
    found: bool = True

    @property
    def display(self) -> str:
        klass = f" (GatewayClass {self.class_name})" if self.class_name else ""
        return f"Gateway {self.namespace}/{self.name}{klass}"


def supported_features(gateway_class: Mapping[str, Any] | None) -> frozenset[str] | None:
    """The names a GatewayClass lists in ``status.supportedFeatures``; None when it lists none (not published)."""
    listed = ((gateway_class or {}).get("status") or {}).get("supportedFeatures")
    if not isinstance(listed, list) or not listed:
        return None
    found = {item if isinstance(item, str) else str(item.get("name") or "") if isinstance(item, Mapping) else ""
             for item in listed}
    return frozenset(f for f in found if f)


def parent_refs(refs: Iterable[Mapping[str, Any]], route_namespace: str) -> list[tuple[str, str]]:
    """``(namespace, name)`` of each Gateway a route names (a parentRef's namespace defaults to the route's)."""
    out = []
    for ref in refs:
        if ref.get("kind", "Gateway") != "Gateway" or ref.get("group", "gateway.networking.k8s.io") not in (
                "gateway.networking.k8s.io", ""):
            continue
        out.append((str(ref.get("namespace") or route_namespace), str(ref["name"])))
    return out


def views(refs: Iterable[Mapping[str, Any]], route_namespace: str,
          gateway_of: Callable[[str, str], Mapping[str, Any] | None],
          class_of: Callable[[str], Mapping[str, Any] | None]) -> tuple[GatewayView, ...]:
    """The route's parent Gateways as :class:`GatewayView`, from what ``gateway_of`` and ``class_of`` hold (the
    operator's watch-fed caches: no request)."""
    found = []
    for namespace, name in parent_refs(refs, route_namespace):
        live = gateway_of(namespace, name)
        class_name = str(((live or {}).get("spec") or {}).get("gatewayClassName") or "") or None
        klass = class_of(class_name) if class_name else None
        found.append(GatewayView(namespace, name, class_name, supported_features(klass), found=live is not None))
    return tuple(found)


Support = Literal["supported", "unsupported", "unknown"]


def support(gateways: Sequence[GatewayView], feature: str) -> Support:
    """Whether every parent Gateway supports ``feature``: "unsupported" as soon as one publishes a list without it,
    "unknown" when one publishes no list (or was not found), else "supported"."""
    if not gateways:
        return "unknown"
    verdicts = ["unknown" if g.features is None else "supported" if feature in g.features else "unsupported"
                for g in gateways]
    if "unsupported" in verdicts:
        return "unsupported"
    return "unknown" if "unknown" in verdicts else "supported"


def lacking(gateways: Sequence[GatewayView], *features: str) -> list[tuple[GatewayView, list[str]]]:
    """The parent Gateways that do not say they support all of ``features``, each with the ones it does not list
    (all of them when it publishes no list)."""
    found = []
    for g in gateways:
        missing = [f for f in features if g.features is None or f not in g.features]
        if missing:
            found.append((g, missing))
    return found


@dataclass(frozen=True)
class RouteVerdict:
    """What the route's parents said of it: ``state`` accepted (every parent accepted it and resolved its
    backends), refused (one did not: ``reason`` is NotAccepted or RefsNotResolved) or pending (no parent has
    reported yet: no gateway controller watches it, or it has not got to it)."""

    state: Literal["accepted", "refused", "pending"]
    reason: str
    message: str


def route_verdict(route: Mapping[str, Any] | None, expected: Sequence[tuple[str, str]]) -> RouteVerdict:
    """The verdict on ``route`` from its ``status.parents`` (one entry per parent and controller), for the parent
    Gateways the model names (``expected``, as :func:`parent_refs` gives them)."""
    if route is None:
        return RouteVerdict("pending", conditions.REASON_ROUTE_PENDING, "the HTTPRoute does not exist yet")
    namespace = str((route.get("metadata") or {}).get("namespace") or "")
    generation = (route.get("metadata") or {}).get("generation")
    reported: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for parent in (route.get("status") or {}).get("parents") or ():
        ref = parent.get("parentRef") or {}
        key = (str(ref.get("namespace") or namespace), str(ref.get("name") or ""))
        reported.setdefault(key, []).extend(parent.get("conditions") or ())
    for key in expected:
        for cond in reported.get(key, ()):
            if generation is not None and cond.get("observedGeneration") not in (None, generation):
                continue  # about an older version of the route
            if cond.get("type") in ("Accepted", "ResolvedRefs") and cond.get("status") == "False":
                reason = (conditions.REASON_NOT_ACCEPTED if cond.get("type") == "Accepted"
                          else conditions.REASON_REFS_NOT_RESOLVED)
                why = f"{cond.get('reason') or cond.get('type')}: {cond.get('message') or 'no message'}"
                return RouteVerdict("refused", reason, f"Gateway {key[0]}/{key[1]} refused the HTTPRoute ({why})")
    silent = [f"{ns}/{name}" for ns, name in expected if not any(
        c.get("type") == "Accepted" and c.get("status") == "True" for c in reported.get((ns, name), ()))]
    if silent:
        return RouteVerdict("pending", conditions.REASON_ROUTE_PENDING,
                            f"no report yet from Gateway {', '.join(silent)} on the HTTPRoute (is its controller "
                            f"running, and does a listener allow routes from this namespace?)")
    gateways = ", ".join(f"{ns}/{name}" for ns, name in expected)
    return RouteVerdict("accepted", conditions.REASON_ROUTE_ACCEPTED,
                        f"the HTTPRoute is accepted by Gateway {gateways}")
