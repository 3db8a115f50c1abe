"""The scheduler's writes to the API server, one function per call (as kube-scheduler's
``framework/api_calls``): the binding, the read-back, the eviction, and the pod conditions and nomination it
sets. No state, no retries: the caller decides. Imports only k8s.api.wire."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kubernetes import client

from gpupool.k8s.api.wire import MERGE_PATCH, STRATEGIC_PATCH, call
from gpupool.k8s.api.wire import now_iso as _now

EVICTION_PATH = "/api/v1/namespaces/{namespace}/pods/{name}/eviction"
POD_STATUS_PATH = "/api/v1/namespaces/{namespace}/pods/{name}/status"
DISRUPTION_TARGET = "DisruptionTarget"  # the pod condition kube-scheduler sets on a preemption victim
PREEMPTION_BY_SCHEDULER = "PreemptionByScheduler"
EVICTION_REFUSED = "EvictionRefused"  # DisruptionTarget=False: the announced eviction was refused, the pod runs on

Timeout = float | tuple[float, float] | None  # seconds: total, or (connect, read), as wire.call takes it


def split_key(key: str) -> tuple[str, str]:
    """``"ns/name"`` -> ``(ns, name)``; a key without a namespace is in ``default``."""
    ns, _, name = key.rpartition("/")
    return ns or "default", name


def post_binding(api_client: client.ApiClient, ns: str, name: str, uid: str, annotations: Mapping[str, str],
                 node: str, timeout: Timeout = None) -> None:
    """POST the ``pods/binding`` subresource of ``ns/name``: ``node`` as target, ``annotations`` copied onto the pod
    by the API server in the same update, ``uid`` (if set) as precondition. Raises :class:`ApiException`
    (``404``: the pod is gone; ``409``: it is bound already) and transport errors."""
    binding_meta: dict[str, Any] = {"name": name, "namespace": ns, "annotations": annotations}
    if uid:
        binding_meta["uid"] = uid
    body = {"apiVersion": "v1", "kind": "Binding", "metadata": binding_meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
    call(api_client, "POST", "/api/v1/namespaces/{namespace}/pods/{name}/binding", body,
         timeout=timeout,
         path_params={"namespace": ns, "name": name})


def binding_failure_message(status: int | None, reason: str | None) -> str:
    """What a user reads on a pod (``FailedScheduling``) when its Binding failed with ``status``: what the answer
    means and that gpupool retries, instead of a bare "Binding rejected: 403 Forbidden" (issue 33 item 7: a
    restarted API server refuses bindings with 403 for a few seconds while its authorization warms up)."""
    what = f"{status} {reason}" if status is not None else (reason or "no answer")
    if status == 403:
        return (f"Binding refused by the API server ({what}); gpupool retries. Right after an API server restart "
                "its authorization needs a few seconds; if it lasts, gpupool's ServiceAccount lacks pods/binding "
                "create")
    if status == 429:
        return f"API server busy ({what}); gpupool retries the binding"
    if status is None or status >= 500:
        return f"the API server did not complete the binding ({what}); gpupool retries"
    return f"Binding rejected: {what}"


def read_pod(api_client: client.ApiClient, ns: str, name: str, timeout: Timeout = None) -> dict[str, Any]:
    """GET pod ``ns/name`` (the read-back after a refused or unanswered binding)."""
    return json.loads(call(api_client, "GET", "/api/v1/namespaces/{namespace}/pods/{name}",
                           timeout=timeout,
                           path_params={"namespace": ns, "name": name}))


def set_unschedulable(api_client: client.ApiClient, ns: str, name: str, message: str, timeout: Timeout = None) -> None:
    """Set ``PodScheduled=False`` (reason ``Unschedulable``, ``message``) on pod ``ns/name`` (strategic merge,
    ``pods/status``)."""
    body = {"status": {"conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
        "lastProbeTime": None, "lastTransitionTime": _now(),
    }]}}
    call(api_client, "PATCH", "/api/v1/namespaces/{namespace}/pods/{name}/status", body,
         content_type=STRATEGIC_PATCH, timeout=timeout,
         path_params={"namespace": ns, "name": name})


def evict(api_client: client.ApiClient, key: str, uid: str, dry_run: bool, timeout: Timeout = None) -> None:
    """POST a policy/v1 Eviction for pod ``key`` (``"ns/name"``) with ``uid`` as precondition.

    ``dry_run``: ``deleteOptions.dryRun=["All"]`` (the API server runs every check, PodDisruptionBudgets
    included, and changes nothing). The pod's own ``terminationGracePeriodSeconds`` applies. Returns on
    ``201``; raises :class:`ApiException` for a refusal (``429``: a PodDisruptionBudget allows no disruption
    now or is not yet processed; ``404``: the pod is gone; ``409``: the UID differs, the pod was replaced;
    ``500``: several budgets match the pod) and urllib3's errors for transport trouble. ``timeout``:
    seconds, ``(connect, read)``.
    """
    ns, name = split_key(key)
    options: dict[str, Any] = {}
    if dry_run:
        options["dryRun"] = ["All"]
    if uid:
        options["preconditions"] = {"uid": uid}
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": ns},
            "deleteOptions": options}
    call(api_client, "POST", EVICTION_PATH, body,
         timeout=timeout,
         path_params={"namespace": ns, "name": name})


def _patch_disruption_target(api_client: client.ApiClient, key: str, status: str, reason: str, message: str,
                             timeout: Timeout) -> None:
    ns, name = split_key(key)
    body = {"status": {"conditions": [{
        "type": DISRUPTION_TARGET, "status": status, "reason": reason,
        "message": message, "lastTransitionTime": _now()}]}}
    call(api_client, "PATCH", POD_STATUS_PATH, body, content_type=STRATEGIC_PATCH,
         timeout=timeout,
         path_params={"namespace": ns, "name": name})


def mark_disruption_target(api_client: client.ApiClient, key: str, reason: str,
                           timeout: Timeout = None) -> None:
    """PATCH (strategic merge, ``pods/status``) the ``DisruptionTarget=True`` condition onto victim ``key``, as
    kube-scheduler does before it removes a victim (reason ``PreemptionByScheduler``, ``reason`` as the
    message). Raises :class:`ApiException` (``404``: the pod is gone) and transport errors."""
    _patch_disruption_target(api_client, key, "True", PREEMPTION_BY_SCHEDULER, reason, timeout)


def clear_disruption_target(api_client: client.ApiClient, key: str, message: str,
                            timeout: Timeout = None) -> None:
    """PATCH (strategic merge, ``pods/status``) ``DisruptionTarget=False`` onto pod ``key``: the eviction
    :func:`mark_disruption_target` announced was refused and the pod runs on (what Kubernetes' disruption
    controller does to a stale condition after two minutes; reason ``EvictionRefused``, ``message`` why). Raises
    :class:`ApiException` (``404``: the pod is gone) and transport errors."""
    _patch_disruption_target(api_client, key, "False", EVICTION_REFUSED, message, timeout)


def set_nominated_node(api_client: client.ApiClient, ns: str, name: str, node: str | None,
                       timeout: Timeout = None) -> None:
    """Merge-patch ``status.nominatedNodeName`` of pod ``ns/name`` to ``node`` (None: removed)."""
    call(api_client, "PATCH", POD_STATUS_PATH, {"status": {"nominatedNodeName": node}},
         content_type=MERGE_PATCH, timeout=timeout,
         path_params={"namespace": ns, "name": name})


__all__ = ["EVICTION_PATH", "POD_STATUS_PATH", "DISRUPTION_TARGET", "PREEMPTION_BY_SCHEDULER", "EVICTION_REFUSED",
           "Timeout", "split_key", "post_binding", "read_pod", "set_unschedulable", "evict", "mark_disruption_target",
           "clear_disruption_target", "set_nominated_node", "binding_failure_message"]


CLAIM_PATH = "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
CLAIM_STATUS_PATH = CLAIM_PATH + "/status"


def write_claim_allocation(api_client: client.ApiClient, ns: str, name: str, resource_version: str,
                           finalizers: list[str] | None, allocation: Mapping[str, Any] | None,
                           reserved_for: list[Mapping[str, str]], timeout: Timeout = None) -> dict[str, Any]:
    """Allocate ResourceClaim ``ns/name`` and reserve it for pods, as kube-scheduler's DRA plugin does in PreBind.

    ``finalizers`` (None: unchanged) are written first (the scheduler adds ``resource.kubernetes.io/delete-protection``
    before it allocates, so that the claim is not deleted while allocated and the resourceclaim controller
    deallocates it when no pod holds it); then the status: ``allocation`` (None: the claim is allocated already,
    only ``reserved_for`` changes) and the whole ``reservedFor`` list. Each write carries the resourceVersion it
    was computed from (merge patch with ``metadata.resourceVersion``): a claim changed meanwhile answers 409 and the
    caller plans again. Needs ``update``/``patch`` on ``resourceclaims``, ``resourceclaims/status`` and (1.36)
    ``resourceclaims/binding``. Returns the claim as the API server last answered. Raises :class:`ApiException`."""
    params = {"namespace": ns, "name": name}
    rv = resource_version
    if finalizers is not None:
        out = json.loads(call(api_client, "PATCH", CLAIM_PATH, {"metadata": {
            "resourceVersion": rv, "finalizers": list(finalizers)}}, content_type=MERGE_PATCH, timeout=timeout,
            path_params=params))
        rv = out["metadata"]["resourceVersion"]
    status: dict[str, Any] = {"reservedFor": [dict(r) for r in reserved_for]}
    if allocation is not None:
        status["allocation"] = dict(allocation)
    return json.loads(call(api_client, "PATCH", CLAIM_STATUS_PATH, {"metadata": {"resourceVersion": rv},
                                                                    "status": status},
                           content_type=MERGE_PATCH, timeout=timeout, path_params=params))


def create_claim(api_client: client.ApiClient, ns: str, body: Mapping[str, Any], timeout: Timeout = None
                 ) -> dict[str, Any]:
    """POST a ResourceClaim (the one made for a pod's extended resources backed by DRA); returns it as stored."""
    return json.loads(call(api_client, "POST", "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims",
                           body, timeout=timeout, path_params={"namespace": ns}))


def delete_claim(api_client: client.ApiClient, ns: str, name: str, timeout: Timeout = None) -> None:
    """DELETE ResourceClaim ``ns/name``."""
    call(api_client, "DELETE", CLAIM_PATH, timeout=timeout, path_params={"namespace": ns, "name": name})


def set_extended_claim_status(api_client: client.ApiClient, ns: str, pod: str, claim: str,
                              mappings: list[Mapping[str, str]], timeout: Timeout = None) -> None:
    """Name the claim of pod ``ns/pod``'s extended resources in ``status.extendedResourceClaimStatus`` (which the
    kubelet reads to hand each container its devices), merge patch on ``pods/status``."""
    body = {"status": {"extendedResourceClaimStatus": {"resourceClaimName": claim,
                                                       "requestMappings": [dict(m) for m in mappings]}}}
    call(api_client, "PATCH", POD_STATUS_PATH, body, content_type=MERGE_PATCH, timeout=timeout,
         path_params={"namespace": ns, "name": pod})
