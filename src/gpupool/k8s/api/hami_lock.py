"""HAMi's node lock, taken and released as HAMi's scheduler does (``pkg/util/nodelock/nodelock.go``, v2.9.0).

HAMi's device plugin, asked by the kubelet to serve a container, must know which pod it is admitting; it reads
the Node's ``hami.io/mutex.lock`` annotation (``RFC3339 time,namespace,name``) and serves that pod's devices
(``pkg/util/util.go`` ``GetPendingPod``; without a lock it takes the first pending pod on the node that carries
HAMi's bind annotations, which is wrong as soon as two are in flight). Once the pod's containers are served it
sets ``hami.io/bind-phase`` and removes the lock. So a binder takes the lock before it binds a pod with HAMi
devices, at most one such pod per node in flight; a lock older than 5 minutes, or whose pod is gone, is taken
over (``LockNode``). Writes carry the Node's ``resourceVersion``: two binders never both win.
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpupool.k8s import ANN_HAMI_NODE_LOCK
from gpupool.k8s.api.wire import MERGE_PATCH, call
from gpupool.k8s.objects.fields import RequestParseError
from gpupool.k8s.objects.hami import HAMI_LOCK_EXPIRE_S, HAMI_LOCK_SEP, node_lock_value, parse_node_lock

NODE_PATH = "/api/v1/nodes/{name}"


def _read_node(api_client: client.ApiClient, node: str, timeout: Any) -> tuple[str | None, str]:
    obj = json.loads(call(api_client, "GET", NODE_PATH, timeout=timeout, path_params={"name": node}))
    meta = obj.get("metadata") or {}
    return (meta.get("annotations") or {}).get(ANN_HAMI_NODE_LOCK), str(meta.get("resourceVersion") or "")


def _pod_gone(api_client: client.ApiClient, ns: str, name: str, timeout: Any) -> bool:
    try:
        call(api_client, "GET", "/api/v1/namespaces/{namespace}/pods/{name}", timeout=timeout,
             path_params={"namespace": ns, "name": name})
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def take_node_lock(api_client: client.ApiClient, node: str, ns: str, name: str, now: float,
                   timeout: Any = None, expire_s: float = HAMI_LOCK_EXPIRE_S) -> str:
    """Take HAMi's lock on ``node`` for pod ``ns/name`` (``now``: Unix seconds). Returns "" when this pod holds it
    now, else why not (held by another pod that exists, for less than ``expire_s``; the Node changed meanwhile;
    an unreadable lock value). Raises :class:`ApiException` and transport errors of the reads and the write."""
    current, rv = _read_node(api_client, node, timeout)
    if current is not None:
        try:
            when, lns, lname = parse_node_lock(current)
        except RequestParseError as exc:
            return f"node {node}: annotation {ANN_HAMI_NODE_LOCK}: {exc}"
        if (lns, lname) == (ns, name):
            return ""
        fresh = now - when <= expire_s
        if fresh and not (lns and lname and _pod_gone(api_client, lns, lname, timeout)):
            holder = f"pod {lns}/{lname}" if lns else "an unnamed holder"
            return f"HAMi's node lock on {node} is held by {holder} (its devices are being handed over)"
    body = {"metadata": {"annotations": {ANN_HAMI_NODE_LOCK: node_lock_value(ns, name, now)}, "resourceVersion": rv}}
    try:
        call(api_client, "PATCH", NODE_PATH, body, content_type=MERGE_PATCH, timeout=timeout,
             path_params={"name": node})
    except ApiException as exc:
        if exc.status == 409:
            return f"node {node} changed while HAMi's node lock was being taken"
        raise
    return ""


def release_node_lock(api_client: client.ApiClient, node: str, ns: str, name: str, timeout: Any = None) -> bool:
    """Remove HAMi's lock on ``node`` if pod ``ns/name`` holds it (``ReleaseNodeLock`` with the owner check);
    returns whether it was removed. Raises :class:`ApiException` (``409``: the Node changed meanwhile) and
    transport errors."""
    current, rv = _read_node(api_client, node, timeout)
    if current is None or not current.endswith(f"{HAMI_LOCK_SEP}{ns}{HAMI_LOCK_SEP}{name}"):
        return False
    body = {"metadata": {"annotations": {ANN_HAMI_NODE_LOCK: None}, "resourceVersion": rv}}
    call(api_client, "PATCH", NODE_PATH, body, content_type=MERGE_PATCH, timeout=timeout, path_params={"name": node})
    return True


__all__ = ["take_node_lock", "release_node_lock", "NODE_PATH"]
