"""Carrying out a pod's DRA allocation before its binding, as kube-scheduler's dynamicresources plugin does in
PreBind: the claim made for its extended resources (if any), the finalizer, ``status.allocation`` and
``status.reservedFor`` of each claim, the pod's ``status.extendedResourceClaimStatus``. No state, no retries:
the caller plans again on failure. Imports only k8s.api and k8s.objects."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpupool.k8s.api.calls import (
    Timeout,
    create_claim,
    delete_claim,
    set_extended_claim_status,
    write_claim_allocation,
)
from gpupool.k8s.objects.dra import FINALIZER_DELETE_PROTECTION, claim_allocation_status


class ClaimWriteError(Exception):
    """A claim write failed: ``status`` (HTTP status, None for transport trouble), ``claim`` (its key), and
    ``written`` the (planned key, claim as stored) written before it (they hold their devices)."""

    def __init__(self, claim: str, status: int | None, reason: str, written: list[tuple[str, dict[str, Any]]]):
        super().__init__(f"ResourceClaim {claim}: {status or ''} {reason}".strip())
        self.claim, self.status, self.reason, self.written = claim, status, reason, written


def write_pod_claims(api_client: client.ApiClient, pod: Mapping[str, Any], uid: str, allocations: Sequence[Any],
                     timeout: Timeout = None) -> list[tuple[str, dict[str, Any], Any]]:
    """Write each planned allocation (a :class:`~gpupool.k8s.cycle.dra.ClaimAllocation`) of pod ``pod`` (UID
    ``uid``); returns (planned claim key, claim as stored, allocation) per claim written. A claim reserved for
    the pod already and allocated is skipped. A claim created here whose later writes fail is deleted again.
    Raises :class:`ClaimWriteError`."""
    meta = pod.get("metadata") or {}
    ref = {"resource": "pods", "name": meta.get("name", ""), "uid": uid}
    written: list[tuple[str, dict[str, Any], Any]] = []
    for ca in allocations:
        claim = ca.claim
        reserved = [{"resource": "pods", "name": n, "uid": u} for n, u in claim.reserved_for]
        if any(r["uid"] == uid for r in reserved) and not ca.results:
            continue  # reserved for this pod already (a restart, or a retried binding)
        reserved.append(ref)
        finalizers = None
        if ca.results and FINALIZER_DELETE_PROTECTION not in claim.finalizers:
            finalizers = [*claim.finalizers, FINALIZER_DELETE_PROTECTION]
        created = None
        try:
            if ca.create is not None:  # extended resources backed by DRA: the pod's claim is made now
                created = create_claim(api_client, claim.namespace, ca.create, timeout=timeout)
                cmeta = created["metadata"]
                claim = replace(claim, name=cmeta["name"], uid=cmeta.get("uid", ""),
                                resource_version=cmeta["resourceVersion"])
            obj = write_claim_allocation(
                api_client, claim.namespace, claim.name, claim.resource_version, finalizers,
                claim_allocation_status(ca.results, ca.node) if ca.results else None, reserved, timeout=timeout)
            if created is not None:
                set_extended_claim_status(api_client, claim.namespace, meta.get("name", ""), claim.name,
                                          list(ca.mappings), timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - reported to the caller, which plans the pod again
            if created is not None:
                try:
                    delete_claim(api_client, claim.namespace, claim.name, timeout=timeout)
                except Exception:  # noqa: BLE001, S110 - owned by the pod: garbage collection removes it with it
                    pass
            status = exc.status if isinstance(exc, ApiException) else None
            reason = str(exc.reason) if isinstance(exc, ApiException) else f"{type(exc).__name__}: {str(exc)[:200]}"
            raise ClaimWriteError(claim.key, status, reason, [(k, o) for k, o, _ in written]) from exc
        written.append((ca.claim.key, obj, ca))
    return written
