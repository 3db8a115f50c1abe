"""DRA end to end on a real kube-apiserver v1.36: gpupool allocates ResourceClaims (resource.k8s.io/v1) itself.

Nodes offer GPUs only through ResourceSlices (no ``nvidia.com/gpu`` in allocatable), as NVIDIA's DRA driver
publishes them for a DGX H100 with DynamicMIG (:mod:`gpupool.k8s.objects.dra_nvidia`): whole GPUs and every MIG
partition, drawing on per-GPU shared counters. Checked against what the API
server stores: every pod with claims is bound to the node its claims' allocation names, reserved in
``status.reservedFor``, the claim carries the scheduler's finalizer, no device is in two claims and no counter
set is overdrawn. With the controller-manager running (``KCP_WITH=controller-manager``), claims made from
templates are allocated too and the devices of deleted pods come back.
"""

from __future__ import annotations

import os
from decimal import Decimal
from typing import Any

import pytest
from kubernetes import client

from gpupool.k8s.objects.dra_nvidia import nvidia_device_classes, preset_slices
from gpupool.k8s.objects.fields import quantity

from . import livecluster as lc
from .livecluster import E2E

pytestmark = pytest.mark.real_apiserver

GROUP, VERSION = "resource.k8s.io", "v1"
DRIVER = "gpu.nvidia.com"
WITH_CONTROLLERS = "controller-manager" in os.environ.get("KCP_WITH", "")


def _slices(node: str, preset: str = "dgx-h100") -> list[dict[str, Any]]:
    """The node's pool as NVIDIA's DRA driver publishes it (DynamicMIG: a slice of counter sets, a slice per GPU)."""
    out = preset_slices(preset, node)
    for s in out:
        s["metadata"]["labels"] = {lc.E2E_LABEL: "1"}
    return out


CLASSES = {
    "e2e-gpu.nvidia.com": f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'gpu'",
    "e2e-mig.nvidia.com": f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'mig'",
}


def _setup(e2e: E2E, nodes: list[str]) -> None:
    custom = client.CustomObjectsApi(e2e.admin)
    for name, expr in CLASSES.items():
        try:
            custom.create_cluster_custom_object(GROUP, VERSION, "deviceclasses", {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "DeviceClass",
                "metadata": {"name": name, "labels": {lc.E2E_LABEL: "1"}},
                "spec": {"selectors": [{"cel": {"expression": expr}}]}})
        except client.exceptions.ApiException as exc:
            if exc.status != 409:
                raise
    for node in nodes:
        lc.make_node(e2e.admin, node, gpus=0)
        for body in _slices(node):
            custom.create_cluster_custom_object(GROUP, VERSION, "resourceslices", body)


def _nvidia_classes(e2e: E2E) -> list[str]:
    """NVIDIA's chart classes (``gpu.nvidia.com`` names the extended resource ``nvidia.com/gpu``): the names made
    here, for the test to delete."""
    custom = client.CustomObjectsApi(e2e.admin)
    made = []
    for cls in nvidia_device_classes(compute_domains=False):
        cls["metadata"]["labels"] = {lc.E2E_LABEL: "1"}
        try:
            custom.create_cluster_custom_object(GROUP, VERSION, "deviceclasses", cls)
            made.append(cls["metadata"]["name"])
        except client.exceptions.ApiException as exc:
            if exc.status != 409:
                raise
    return made


def _teardown(e2e: E2E) -> None:
    custom = client.CustomObjectsApi(e2e.admin)
    custom.delete_collection_cluster_custom_object(GROUP, VERSION, "resourceslices",
                                                   label_selector=f"{lc.E2E_LABEL}=1")


def _claim(ns: str, name: str, cls: str, count: int = 1, selectors: list[str] | None = None,
           profile: str | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls, "count": count}
    sels = list(selectors or [])
    if profile:
        sels.append(f"device.attributes['{DRIVER}'].profile == '{profile}'")
    if sels:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in sels]
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": ns},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}


def _pod(ns: str, name: str, claims: list[tuple[str, str]], template: bool = False) -> dict[str, Any]:
    body = lc.pod_body(name, ns, gpus=None)
    key = "resourceClaimTemplateName" if template else "resourceClaimName"
    body["spec"]["resourceClaims"] = [{"name": entry, key: target} for entry, target in claims]
    body["spec"]["containers"][0]["resources"]["claims"] = [{"name": entry} for entry, _ in claims]
    return body


def _claims(e2e: E2E) -> list[dict[str, Any]]:
    return client.CustomObjectsApi(e2e.admin).list_namespaced_custom_object(GROUP, VERSION, e2e.ns,
                                                                           "resourceclaims")["items"]


def _check_allocations(e2e: E2E) -> dict[str, Any]:
    """No device in two claims, no counter set overdrawn, every reserved pod bound where its claim is allocated."""
    custom = client.CustomObjectsApi(e2e.admin)
    slices = custom.list_cluster_custom_object(GROUP, VERSION, "resourceslices")["items"]
    consumes, totals, shared_cap = {}, {}, {}
    shared_used: dict[tuple[str, str], dict[str, Decimal]] = {}
    for s in slices:
        pool = s["spec"]["pool"]["name"]
        for cs in s["spec"].get("sharedCounters") or ():
            totals[(pool, cs["name"])] = {k: quantity(v["value"], k) for k, v in cs["counters"].items()}
        for d in s["spec"].get("devices") or ():
            consumes[(pool, d["name"])] = d.get("consumesCounters") or []
            if d.get("allowMultipleAllocations"):
                caps = d.get("capacity") or {}
                shared_cap[(pool, d["name"])] = {k: quantity(v["value"], k) for k, v in caps.items()}
    pods = {p["metadata"]["name"]: p for p in lc.list_pods(e2e.admin, e2e.ns)}
    held: dict[tuple[str, str], str] = {}
    used: dict[tuple[str, str], dict[str, Decimal]] = {}
    for c in _claims(e2e):
        alloc = (c.get("status") or {}).get("allocation")
        if not alloc:
            continue
        node = alloc["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"][0]
        for r in alloc["devices"]["results"]:
            key = (r["pool"], r["device"])
            if key in shared_cap:  # a shared device: its shares within its capacity
                for k, v in (r.get("consumedCapacity") or {}).items():
                    used_k = shared_used.setdefault(key, {})
                    used_k[k] = used_k.get(k, Decimal(0)) + quantity(v, k)
                    assert used_k[k] <= shared_cap[key][k], f"shared device {key}: {k} over capacity"
                if key in held:
                    continue
            else:
                assert key not in held, f"device {key} allocated to {held[key]} and {c['metadata']['name']}"
            held[key] = c["metadata"]["name"]
            assert r["pool"] == node, f"claim {c['metadata']['name']}: device of {r['pool']} on node {node}"
            for cc in consumes[key]:
                u = used.setdefault((r["pool"], cc["counterSet"]), {})
                for k, v in cc["counters"].items():
                    u[k] = u.get(k, Decimal(0)) + quantity(v["value"], k)
        for ref in (c.get("status") or {}).get("reservedFor") or ():
            pod = pods.get(ref["name"])
            if pod is not None and pod["spec"].get("nodeName"):
                assert pod["spec"]["nodeName"] == node, (ref["name"], pod["spec"]["nodeName"], node)
    for key, u in used.items():
        for k, v in u.items():
            assert v <= totals[key][k], f"counter {k} of {key} overdrawn: {v} > {totals[key][k]}"
    return {"devices": len(held)}


def test_claims_allocated_before_binding(e2e: E2E) -> None:
    """Whole GPUs and MIG partitions from direct claims; a claim shared by two pods; a pod without claims on a
    DRA-only cluster; a claim no node can satisfy stays pending with the request named."""
    nodes = ["dra-a", "dra-b"]
    _setup(e2e, nodes)
    try:
        custom = client.CustomObjectsApi(e2e.admin)
        core = client.CoreV1Api(e2e.admin)
        want = []
        specs = [("whole2", "e2e-gpu.nvidia.com", 2, None), ("whole1", "e2e-gpu.nvidia.com", 1, None),
                 ("mig1a", "e2e-mig.nvidia.com", 1, "1g.10gb"), ("mig1b", "e2e-mig.nvidia.com", 1, "1g.10gb"),
                 ("mig3", "e2e-mig.nvidia.com", 1, "3g.40gb"), ("shared", "e2e-gpu.nvidia.com", 1, None),
                 ("toomany", "e2e-gpu.nvidia.com", 9, None)]
        for name, cls, count, profile in specs:
            custom.create_namespaced_custom_object(GROUP, VERSION, e2e.ns, "resourceclaims",
                                                   _claim(e2e.ns, name, cls, count, profile=profile))
        for name, *_ in specs:
            if name == "shared":
                continue
            lc.create_pod(e2e.admin, _pod(e2e.ns, f"p-{name}", [("gpu", name)]))
            if name != "toomany":
                want.append(f"p-{name}")
        for i in (1, 2):
            lc.create_pod(e2e.admin, _pod(e2e.ns, f"p-shared-{i}", [("gpu", "shared")]))
            want.append(f"p-shared-{i}")
        lc.create_pod(e2e.admin, lc.pod_body("p-plain", e2e.ns, gpus=None))
        want.append("p-plain")
        sched = e2e.scheduler_inprocess()
        pods = lc.wait_bound(e2e.admin, e2e.ns, want, 60)
        by_name = {p["metadata"]["name"]: p for p in pods}
        claims = {c["metadata"]["name"]: c for c in _claims(e2e)}
        for name, *_ in specs:
            c = claims[name]
            if name == "toomany":
                assert not (c.get("status") or {}).get("allocation")
                continue
            assert "resource.kubernetes.io/delete-protection" in c["metadata"].get("finalizers", []), name
            reserved = {r["name"] for r in c["status"].get("reservedFor", [])}
            holders = {"p-shared-1", "p-shared-2"} if name == "shared" else {f"p-{name}"}
            assert reserved == holders, (name, reserved)
            node = c["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"][0]
            for h in holders:
                assert by_name[h]["spec"]["nodeName"] == node
        assert len(claims["whole2"]["status"]["allocation"]["devices"]["results"]) == 2
        figures = _check_allocations(e2e)
        # both 1g partitions on one GPU (gpupool packs partitions), and the pods packed onto one node
        mig_parents = {r["device"].rsplit("-mig-", 1)[0] + "@" + r["pool"]
                       for n in ("mig1a", "mig1b") for r in claims[n]["status"]["allocation"]["devices"]["results"]}
        assert len(mig_parents) == 1, mig_parents
        lc.wait_for(lambda: any("toomany" in (e.get("message") or "") and "request gpu" in (e.get("message") or "")
                                for e in lc.events_for(e2e.admin, e2e.ns, "FailedScheduling")), 20,
                    "FailedScheduling naming the request of the claim that fits nowhere")
        pod = core.read_namespaced_pod("p-toomany", e2e.ns)
        assert not pod.spec.node_name
        lc.RESULTS["dra_devices_allocated"] = figures["devices"]
        assert sched is not None
    finally:
        _teardown(e2e)


@pytest.mark.skipif(not WITH_CONTROLLERS, reason="needs KCP_WITH=controller-manager (ResourceClaimTemplates, "
                    "claim release)")
def test_claims_from_templates_and_release(e2e: E2E) -> None:
    """Claims made by the resourceclaim controller from templates are allocated; when the pods are deleted the
    claims go (with the controller) and their devices are allocated again to new pods."""
    nodes = ["dra-t"]
    _setup(e2e, nodes)
    try:
        custom = client.CustomObjectsApi(e2e.admin)
        custom.create_namespaced_custom_object(GROUP, VERSION, e2e.ns, "resourceclaimtemplates", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "two-gpus", "namespace": e2e.ns},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "e2e-gpu.nvidia.com", "count": 2}}]}}}})
        e2e.scheduler_inprocess()
        first = [f"t-{i}" for i in range(4)]  # 4 x 2 GPUs: the node's 8
        for name in first:
            lc.create_pod(e2e.admin, _pod(e2e.ns, name, [("gpu", "two-gpus")], template=True))
        lc.wait_bound(e2e.admin, e2e.ns, first, 60)
        _check_allocations(e2e)
        lc.create_pod(e2e.admin, _pod(e2e.ns, "t-late", [("gpu", "two-gpus")], template=True))
        core = client.CoreV1Api(e2e.admin)
        lc.wait_for(lambda: any(e.get("involvedObject", {}).get("name") == "t-late"
                                for e in lc.events_for(e2e.admin, e2e.ns, "FailedScheduling")), 30,
                    "t-late refused while the node's GPUs are all allocated")
        assert not core.read_namespaced_pod("t-late", e2e.ns).spec.node_name
        core.delete_namespaced_pod(first[0], e2e.ns, grace_period_seconds=0)
        lc.wait_bound(e2e.admin, e2e.ns, ["t-late"], 90)  # the controller released t-0's claim, gpupool reused it
        _check_allocations(e2e)
    finally:
        _teardown(e2e)


def test_extended_resource_backed_by_dra(e2e: E2E) -> None:
    """``nvidia.com/gpu: 2`` on nodes whose GPUs only NVIDIA's DRA driver offers (its chart's class names the
    extended resource): gpupool makes the pod's claim as kube-scheduler does (generateName, annotation, owner),
    allocates it, names it in the pod's ``status.extendedResourceClaimStatus`` and binds."""
    custom = client.CustomObjectsApi(e2e.admin)
    made = _nvidia_classes(e2e)
    _setup(e2e, ["dra-x"])
    try:
        e2e.scheduler_inprocess()
        lc.create_pod(e2e.admin, lc.pod_body("ext-2", e2e.ns, gpus=2))
        lc.create_pod(e2e.admin, lc.pod_body("ext-8", e2e.ns, gpus=8))  # 6 left: waits
        pods = lc.wait_bound(e2e.admin, e2e.ns, ["ext-2"], 60)
        status = pods[0].get("status") or {}
        ext = status.get("extendedResourceClaimStatus") or {}
        assert ext.get("resourceClaimName", "").startswith("ext-2-extended-resources-"), status
        assert ext["requestMappings"] == [{"containerName": "main", "resourceName": "nvidia.com/gpu",
                                           "requestName": "container-0-request-2"}]  # cpu, memory, nvidia.com/gpu
        c = custom.get_namespaced_custom_object(GROUP, VERSION, e2e.ns, "resourceclaims", ext["resourceClaimName"])
        assert c["metadata"]["annotations"]["resource.kubernetes.io/extended-resource-claim"] == "true"
        assert c["metadata"]["ownerReferences"][0]["name"] == "ext-2"
        assert len(c["status"]["allocation"]["devices"]["results"]) == 2
        assert [r["name"] for r in c["status"]["reservedFor"]] == ["ext-2"]
        _check_allocations(e2e)
        lc.wait_for(lambda: any(e.get("involvedObject", {}).get("name") == "ext-8"
                                for e in lc.events_for(e2e.admin, e2e.ns, "FailedScheduling")), 30,
                    "ext-8 refused: 6 GPUs left")
    finally:
        _teardown(e2e)
        for name in made:
            custom.delete_cluster_custom_object(GROUP, VERSION, "deviceclasses", name)


def test_pool_mode_claims_and_queue_limits(e2e: E2E) -> None:
    """The pool scheduler on a DRA-only cluster: a pod without claims, pods with claims and a pod asking
    ``nvidia.com/gpu`` run; a queue is charged what its pods' claims hold, and a claim past its limit waits."""
    from gpupool.k8s.cycle.pool import live_config

    custom = client.CustomObjectsApi(e2e.admin)
    made = _nvidia_classes(e2e)
    _setup(e2e, ["dra-p"])
    queue = f"{e2e.ns}-team"[:63]
    lc.create_queue(e2e.admin, queue, {"quota": 2, "limit": 4})
    try:
        e2e.scheduler_inprocess("e2e-pool", pool_config=live_config(min_run_s=0.0), resync_s=0.5,
                                queue_status_s=0.5)
        labels = {"kueue.x-k8s.io/queue-name": queue}
        for name, count in (("q-a", 2), ("q-b", 1), ("q-c", 2)):
            custom.create_namespaced_custom_object(GROUP, VERSION, e2e.ns, "resourceclaims",
                                                   _claim(e2e.ns, name, "gpu.nvidia.com", count))
            body = _pod(e2e.ns, f"p-{name}", [("gpu", name)])
            body["metadata"]["labels"].update(labels)
            lc.create_pod(e2e.admin, body)
        lc.create_pod(e2e.admin, lc.pod_body("p-plain", e2e.ns, gpus=None))
        lc.create_pod(e2e.admin, lc.pod_body("p-ext", e2e.ns, gpus=1))
        lc.wait_bound(e2e.admin, e2e.ns, ["p-q-a", "p-q-b", "p-plain", "p-ext"], 60)
        lc.wait_for(lambda: any(e.get("involvedObject", {}).get("name") == "p-q-c"
                                and queue in (e.get("message") or "")
                                for e in lc.events_for(e2e.admin, e2e.ns, "FailedScheduling")), 30,
                    "p-q-c refused: its queue would hold 5 GPUs over its limit of 4")
        assert not client.CoreV1Api(e2e.admin).read_namespaced_pod("p-q-c", e2e.ns).spec.node_name
        _check_allocations(e2e)
    finally:
        _teardown(e2e)
        for name in made:
            custom.delete_cluster_custom_object(GROUP, VERSION, "deviceclasses", name)


def test_restart_with_claim_half_written_and_slices_that_change(e2e: E2E) -> None:
    """A claim allocated and reserved for a pod that was never bound (the scheduler died between the two
    writes): the next scheduler binds that pod where its claim is and gives its devices to nobody else. The driver
    republished one pool (generation 2) without gpu-7: no claim gets it."""
    _setup(e2e, ["dra-r1", "dra-r2"])
    custom = client.CustomObjectsApi(e2e.admin)
    try:
        for s in custom.list_cluster_custom_object(GROUP, VERSION, "resourceslices")["items"]:
            if s["spec"]["nodeName"] != "dra-r1":
                continue
            s["spec"]["pool"]["generation"] = 2
            if s["spec"].get("devices"):
                s["spec"]["devices"] = [d for d in s["spec"]["devices"] if not d["name"].startswith("gpu-7")]
            custom.replace_cluster_custom_object(GROUP, VERSION, "resourceslices", s["metadata"]["name"], s)
        custom.create_namespaced_custom_object(GROUP, VERSION, e2e.ns, "resourceclaims",
                                               _claim(e2e.ns, "half", "e2e-gpu.nvidia.com", 1))
        lc.create_pod(e2e.admin, _pod(e2e.ns, "p-half", [("gpu", "half")]))
        pod = client.CoreV1Api(e2e.admin).read_namespaced_pod("p-half", e2e.ns)
        c = custom.get_namespaced_custom_object(GROUP, VERSION, e2e.ns, "resourceclaims", "half")
        c["metadata"]["finalizers"] = ["resource.kubernetes.io/delete-protection"]
        c = custom.replace_namespaced_custom_object(GROUP, VERSION, e2e.ns, "resourceclaims", "half", c)
        c["status"] = {"allocation": {
            "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": "dra-r2", "device": "gpu-3"}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": ["dra-r2"]}]}]}},
            "reservedFor": [{"resource": "pods", "name": "p-half", "uid": pod.metadata.uid}]}
        custom.replace_namespaced_custom_object_status(GROUP, VERSION, e2e.ns, "resourceclaims", "half", c)
        # 15 single-GPU claims; 16 GPUs less gpu-7 of dra-r1 (gone) and gpu-3 of dra-r2 (held): 14 fit
        names = []
        for i in range(15):
            custom.create_namespaced_custom_object(GROUP, VERSION, e2e.ns, "resourceclaims",
                                                   _claim(e2e.ns, f"one-{i}", "e2e-gpu.nvidia.com", 1))
            lc.create_pod(e2e.admin, _pod(e2e.ns, f"p-one-{i}", [("gpu", f"one-{i}")]))
            names.append(f"p-one-{i}")
        e2e.scheduler_inprocess()
        lc.wait_for(lambda: len(lc.bound(lc.list_pods(e2e.admin, e2e.ns))) == 15, 90, "15 pods bound")
        lc.wait_for(lambda: any(e.get("involvedObject", {}).get("name") in names
                                for e in lc.events_for(e2e.admin, e2e.ns, "FailedScheduling")), 30,
                    "the 15th single-GPU pod refused: no GPU left")
        pods = {p["metadata"]["name"]: p for p in lc.list_pods(e2e.admin, e2e.ns)}
        assert pods["p-half"]["spec"]["nodeName"] == "dra-r2"
        assert sum(1 for n in names if pods[n]["spec"].get("nodeName")) == 14
        for claim in _claims(e2e):
            for r in ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", []):
                assert (r["pool"], r["device"]) != ("dra-r1", "gpu-7")
        _check_allocations(e2e)
    finally:
        _teardown(e2e)


def test_shared_gpus_and_gangs_with_claims(e2e: E2E) -> None:
    """Consumable capacity (an L40S shared by memory, ``allowMultipleAllocations``): two 20 GiB shares on one GPU
    with their ``consumedCapacity`` and ``shareID``; a gang of two 4-GPU claims starts together on a DGX, a second
    gang that cannot fit starts none of its pods."""
    custom = client.CustomObjectsApi(e2e.admin)
    _setup(e2e, ["dra-g"])
    lc.make_node(e2e.admin, "dra-s", gpus=0)
    for body in preset_slices("l40s", "dra-s", consumable_shares="memory"):
        body["metadata"]["labels"] = {lc.E2E_LABEL: "1"}
        custom.create_cluster_custom_object(GROUP, VERSION, "resourceslices", body)
    try:
        for i in range(3):
            c = _claim(e2e.ns, f"share-{i}", "e2e-gpu.nvidia.com", 1)
            c["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {"requests": {"memory": "20Gi"}}
            custom.create_namespaced_custom_object(GROUP, VERSION, e2e.ns, "resourceclaims", c)
            lc.create_pod(e2e.admin, _pod(e2e.ns, f"p-share-{i}", [("gpu", f"share-{i}")]))
        for gang, n, count in (("fits", 2, 4), ("nofit", 2, 6)):
            lc.create_pod_group(e2e.admin, e2e.ns, gang, n)
            for i in range(n):
                name = f"{gang}-{i}"
                custom.create_namespaced_custom_object(GROUP, VERSION, e2e.ns, "resourceclaims",
                                                       _claim(e2e.ns, name, "e2e-gpu.nvidia.com", count))
                body = _pod(e2e.ns, f"p-{name}", [("gpu", name)])
                body["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] = gang
                lc.create_pod(e2e.admin, body)
        e2e.scheduler_inprocess()
        lc.wait_bound(e2e.admin, e2e.ns, ["p-share-0", "p-share-1", "p-share-2", "p-fits-0", "p-fits-1"], 60)
        claims = {c["metadata"]["name"]: c for c in _claims(e2e)}
        results = [claims[f"share-{i}"]["status"]["allocation"]["devices"]["results"][0] for i in range(3)]
        assert all(r["pool"] == "dra-s" and r.get("shareID") for r in results), results
        # consumedCapacity spelled as the slice names the capacity (unqualified: the driver's domain)
        assert all(quantity(r["consumedCapacity"]["memory"], "m") == 20 * 2**30 for r in results)
        devices = sorted(r["device"] for r in results)
        assert len(set(devices)) == 2 and max(devices.count(d) for d in devices) == 2, devices  # two share one
        assert {claims[f"fits-{i}"]["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]
                ["values"][0] for i in range(2)} == {"dra-g"}
        lc.wait_for(lambda: any("gang" in (e.get("message") or "") and
                                e.get("involvedObject", {}).get("name", "").startswith("p-nofit")
                                for e in lc.events_for(e2e.admin, e2e.ns, "FailedScheduling")), 30,
                    "the gang that cannot fit refused as a whole")
        pods = {p["metadata"]["name"]: p for p in lc.list_pods(e2e.admin, e2e.ns)}
        assert not pods["p-nofit-0"]["spec"].get("nodeName") and not pods["p-nofit-1"]["spec"].get("nodeName")
        assert not (claims["nofit-0"].get("status") or {}).get("allocation")
        _check_allocations(e2e)
    finally:
        _teardown(e2e)


@pytest.mark.skipif(not WITH_CONTROLLERS, reason="needs KCP_WITH=controller-manager,kubelet-sim (claims released "
                    "when the preempted pod is gone)")
def test_preemption_frees_the_victims_claims(e2e: E2E) -> None:
    """A higher-priority pod whose claim fits nowhere evicts the cheapest lower-priority pod holding claims on a
    node (Eviction API), the resourceclaim controller releases the victim's claim, and the pod gets its devices."""
    sched_api = client.SchedulingV1Api(e2e.admin)
    for name, value in (("e2e-dra-low", 10), ("e2e-dra-high", 1000)):
        try:
            sched_api.create_priority_class({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                             "metadata": {"name": name, "labels": {lc.E2E_LABEL: "1"}},
                                             "value": value})
        except client.exceptions.ApiException as exc:
            if exc.status != 409:
                raise
    custom = client.CustomObjectsApi(e2e.admin)
    _setup(e2e, ["dra-pre"])
    try:
        custom.create_namespaced_custom_object(GROUP, VERSION, e2e.ns, "resourceclaimtemplates", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "four", "namespace": e2e.ns},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "e2e-gpu.nvidia.com", "count": 4}}]}}}})
        e2e.scheduler_inprocess()
        low = ["low-0", "low-1"]
        for name in low:
            body = _pod(e2e.ns, name, [("gpu", "four")], template=True)
            body["spec"]["priorityClassName"] = "e2e-dra-low"
            lc.create_pod(e2e.admin, body)
        lc.wait_bound(e2e.admin, e2e.ns, low, 60)
        body = _pod(e2e.ns, "high", [("gpu", "four")], template=True)
        body["spec"]["priorityClassName"] = "e2e-dra-high"
        lc.create_pod(e2e.admin, body)
        lc.wait_bound(e2e.admin, e2e.ns, ["high"], 90)
        pods = {p["metadata"]["name"]: p for p in lc.list_pods(e2e.admin, e2e.ns)}
        survivors = [n for n in low if n in pods and not pods[n]["metadata"].get("deletionTimestamp")]
        assert len(survivors) == 1, survivors  # exactly one victim: 4 GPUs were needed
        _check_allocations(e2e)
    finally:
        _teardown(e2e)
        for name in ("e2e-dra-low", "e2e-dra-high"):
            try:
                sched_api.delete_priority_class(name)
            except client.exceptions.ApiException:
                pass
