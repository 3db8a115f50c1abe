"""``--share-enforcement``: a GPU share is placed only where something enforces it, and with ``hami`` gpupool
writes exactly what HAMi's device plugin reads (issue 28, part 2).

The expected device strings are HAMi's own test examples (Project-HAMi/HAMi v2.9.0:
``pkg/device-plugin/nvidiadevice/nvinternal/plugin/util_test.go`` ``TestGetNextDeviceRequest_*``,
``pkg/device/devices_test.go`` ``Test_DecodePodDevices`` and ``TestEncodeContainerDeviceType``), produced here
from pods whose asks give those figures.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from gpupool.cli import app
from gpupool.k8s import SHARE_ENFORCEMENT_MODES
from gpupool.k8s.cycle.planner import plan
from gpupool.k8s.objects.fields import RequestParseError
from gpupool.k8s.objects.hami import (
    encode_pod_devices,
    hami_container_asks,
    hami_devices_for,
    hami_pod_annotations,
    node_lock_value,
    parse_node_lock,
)
from gpupool.k8s.objects.nodes import hami_registered_gpus
from gpupool.k8s.objects.pods import hami_devices
from gpupool.k8s.objects.snapshots import ClusterSnapshot
from gpupool.k8s.scheduler_cli import ConfigError, load_config
from test_k8s_scheduler import NODES

H100_MIB = 81559


def node(name: str, hami: list[str] | None = None, gpus: int = 2, devmem: int = H100_MIB) -> dict[str, Any]:
    """A device-plugin node; ``hami``: the UUIDs HAMi's device plugin registered (its JSON format, HAMi >= 2.4:
    ``pkg/device/devices.go`` ``MarshalNodeDevices``; each GPU split 10 ways, so allocatable counts slots)."""
    ann = {}
    if hami is not None:
        ann["hami.io/node-nvidia-register"] = json.dumps([
            {"index": i, "id": u, "count": 10, "devmem": devmem, "devcore": 100, "type": "NVIDIA-H100-80GB-HBM3",
             "numa": 0, "health": True} for i, u in enumerate(hami)])
    slots = str(len(hami) * 10) if hami is not None else str(gpus)
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                         "annotations": ann},
            "spec": {}, "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": slots},
                                   "conditions": [{"type": "Ready", "status": "True"}]}}


def pod(name: str, limits: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
        containers: list[dict[str, str]] | None = None, init: list[dict[str, str]] | None = None) -> dict[str, Any]:
    def ctr(prefix: str, i: int, lim: dict[str, str]) -> dict[str, Any]:
        return {"name": f"{prefix}{i}", "image": "x", "resources": {"limits": lim}}

    spec: dict[str, Any] = {"schedulerName": "gpupool",
                            "containers": [ctr("c", i, lim) for i, lim in enumerate(containers or [limits or {}])]}
    if init is not None:
        spec["initContainers"] = [ctr("i", i, lim) for i, lim in enumerate(init)]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "annotations": annotations or {}},
            "spec": spec, "status": {"phase": "Pending"}}


def placements(nodes: list[dict], pods: list[dict], mode: str) -> dict[str, Any]:
    snap = ClusterSnapshot(nodes=nodes, pods=pods, pod_groups=[], queues=None)
    return {p.pod: p for p in plan(snap, share_enforcement=mode).placements}


WHOLE = {"nvidia.com/gpu": "1"}
HAMI_SHARE = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10000", "nvidia.com/gpucores": "30"}
KAI = {"gpu-fraction": "0.5"}


# ------------------------------------------------------------------ the device string, as HAMi writes it
def registered(*uuids: str, devmem: int = H100_MIB):
    out = hami_registered_gpus(node("n", hami=list(uuids), devmem=devmem))
    assert out is not None
    return out


@pytest.mark.parametrize("the_pod, gpus, uuids, expected", [
    # util_test.go TestGetNextDeviceRequest_DeviceInRegularContainer
    (pod("p", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "30"}), (0,),
     ("GPU-abc123",), "GPU-abc123,NVIDIA,1000,30:;"),
    # ... DeviceInInitContainer: an init container with a GPU, an app container without
    (pod("p", containers=[{}], init=[{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "500", "nvidia.com/gpucores": "10"}]),
     (0,), ("GPU-init1",), "GPU-init1,NVIDIA,500,10:;;"),
    # ... DeviceInRegularContainerWithInitOffset: two init containers without GPUs, then the app container
    (pod("p", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2000", "nvidia.com/gpucores": "50"}, init=[{}, {}]),
     (0,), ("GPU-main1",), ";;GPU-main1,NVIDIA,2000,50:;"),
    # devices_test.go Test_DecodePodDevices: two containers, one card each
    (pod("p", containers=[{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "500", "nvidia.com/gpucores": "3"}] * 2),
     (0, 1), ("GPU-8dcd427f-483b-b48f-d7e5-75fb19a52b76", "GPU-ebe7c3f7-303d-558d-435e-99a160631fe4"),
     "GPU-8dcd427f-483b-b48f-d7e5-75fb19a52b76,NVIDIA,500,3:;GPU-ebe7c3f7-303d-558d-435e-99a160631fe4,NVIDIA,500,3:;"),
])
def test_device_string_matches_hamis_own_examples(the_pod, gpus, uuids, expected):
    assert hami_devices_for(the_pod, gpus, registered(*uuids)) == expected


def test_one_container_with_two_cards_joins_them_with_a_colon():
    """devices_test.go TestEncodeContainerDeviceType's devices, as EncodeContainerDevices writes them (each
    device followed by ':', the container by ';')."""
    assert encode_pod_devices([[("GPU-936619fc-f6a1-74a8-0bc6-ecf6b3269313", 1000, 10),
                                ("GPU-ebe7c3f7-303d-558d-435e-99a160631fe4", 3000, 30)]]) == (
        "GPU-936619fc-f6a1-74a8-0bc6-ecf6b3269313,NVIDIA,1000,10:GPU-ebe7c3f7-303d-558d-435e-99a160631fe4,NVIDIA,3000,30:;")
    two = pod("p", {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"})
    assert hami_devices_for(two, (1, 0), registered("GPU-a", "GPU-b")) == (
        "GPU-b,NVIDIA,3000,30:GPU-a,NVIDIA,3000,30:;")


def test_memory_as_hami_computes_it_percentage_or_the_whole_card():
    """fitInDevices: memreq = Totalmem * percentage / 100 (integer); no memory asked = 100 % (defaultMemory 0);
    no cores asked = 0 (defaultCores 0, no SM cap); cores above 100 are 100."""
    cards = registered("GPU-a", devmem=81920)
    pct = pod("p", {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "25"})
    assert hami_devices_for(pct, (0,), cards) == "GPU-a,NVIDIA,20480,0:;"
    assert hami_devices_for(pod("p", WHOLE), (0,), cards) == "GPU-a,NVIDIA,81920,0:;"
    assert hami_container_asks(pod("p", {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "150"}))[0].cores == 100


def test_no_string_for_a_pod_without_nvidia_gpu_and_errors_name_the_cause():
    assert hami_devices_for(pod("p", annotations=KAI), (0,), registered("GPU-a")) == ""
    with pytest.raises(ValueError, match="ask 2 card"):
        hami_devices_for(pod("p", {"nvidia.com/gpu": "2"}), (0,), registered("GPU-a", "GPU-b"))
    with pytest.raises(ValueError, match="device 3 has no UUID"):
        hami_devices_for(pod("p", WHOLE), (3,), registered("GPU-a"))
    with pytest.raises(RequestParseError, match=r'spec.containers\[0\].resources\["nvidia.com/gpumem"\]'):
        hami_container_asks(pod("p", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1.5"}))


def test_pod_annotations_are_hamis_keys_and_read_back_by_gpupool():
    devices = hami_devices_for(pod("p", containers=[HAMI_SHARE, {}, HAMI_SHARE]), (0, 1), registered("G0", "G1"))
    ann = hami_pod_annotations("n1", devices, 1_700_000_000.7)
    assert ann == {"hami.io/vgpu-node": "n1", "hami.io/vgpu-time": "1700000000",
                   "hami.io/vgpu-devices-to-allocate": "G0,NVIDIA,10000,30:;;G1,NVIDIA,10000,30:;",
                   "hami.io/vgpu-devices-allocated": "G0,NVIDIA,10000,30:;;G1,NVIDIA,10000,30:;",
                   "hami.io/bind-phase": "allocating", "hami.io/bind-time": "1700000000"}
    bound = pod("p")
    bound["spec"]["nodeName"] = "n1"
    bound["metadata"]["annotations"] = ann
    assert hami_devices(bound) == ("G0", "G1")  # a restarted gpupool counts the pod on those cards


def test_node_lock_value_is_rfc3339_namespace_name():
    """nodelock.GenerateNodeLockKeyByPod: time.Now().Format(time.RFC3339) + ",ns,name"; ParseNodeLock also takes
    a bare time and another zone's offset."""
    assert node_lock_value("ml", "p", 0) == "1970-01-01T00:00:00Z,ml,p"
    assert parse_node_lock("1970-01-01T00:00:00Z,ml,p") == (0.0, "ml", "p")
    assert parse_node_lock("1970-01-01T08:00:00+08:00") == (0.0, "", "")
    with pytest.raises(RequestParseError, match="expected 'time,namespace,name'"):
        parse_node_lock("a,b")
    with pytest.raises(RequestParseError, match="not an RFC 3339 time"):
        parse_node_lock("yesterday,ml,p")


# ------------------------------------------------------------------ where a share may go
def test_none_refuses_every_share_with_what_to_install_and_places_whole_and_mig():
    mig_node = node("mig")
    mig_node["metadata"]["labels"]["nvidia.com/mig.strategy"] = "mixed"
    mig_node["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] = "7"
    got = placements([node("a"), node("h", hami=["GPU-h0", "GPU-h1"]), mig_node],
                     [pod("whole", WHOLE), pod("kai", annotations=KAI), pod("hami", HAMI_SHARE),
                      pod("mig", {"nvidia.com/mig-1g.10gb": "1"}), pod("mem", annotations={"gpu-memory": "4000"})],
                     "none")
    assert got["ml/whole"].node is not None and got["ml/mig"].node == "mig"
    for key in ("ml/kai", "ml/hami", "ml/mem"):
        assert got[key].node is None
        assert "3 node(s) had no mechanism enforcing a GPU share" in got[key].reason
        assert "install HAMi's device plugin and start gpupool with --share-enforcement hami" in got[key].reason
        assert "DRA ResourceClaim" in got[key].reason
        assert "HAMi's device plugin is registered on h" in got[key].reason  # the node that has one


def test_hami_places_shares_only_on_registered_nodes_and_says_which():
    got = placements([node("a"), node("h", hami=["GPU-h0", "GPU-h1"])],
                     [pod("hami", HAMI_SHARE), pod("whole", WHOLE)], "hami")
    share = got["ml/hami"]
    assert share.node == "h" and share.hami_devices == f"GPU-h{share.gpus[0]},NVIDIA,10000,30:;"
    assert share.to_json()["hami_devices"] == share.hami_devices
    alone = placements([node("a"), node("b")], [pod("hami", HAMI_SHARE)], "hami")["ml/hami"]
    assert alone.node is None and alone.hami_devices == ""
    assert alone.reason == (
        "0/2 nodes are available: 2 node(s) had no mechanism enforcing a GPU share (HAMi's device plugin has not "
        "registered there: no hami.io/node-nvidia-register annotation; registered on no node: install its DaemonSet "
        "on the GPU nodes, or ask for the share through a DRA ResourceClaim).")


def test_hami_hands_whole_gpus_on_its_nodes_over_too_and_none_elsewhere():
    """HAMi's plugin serves every container asking nvidia.com/gpu on its nodes: a whole-GPU pod there carries the
    device string too; on a plain node the NVIDIA device plugin hands it over, no HAMi key is written."""
    on_hami = placements([node("h", hami=["GPU-h0"])], [pod("whole", WHOLE)], "hami")["ml/whole"]
    assert on_hami.node == "h" and on_hami.hami_devices == f"GPU-h0,NVIDIA,{H100_MIB},0:;"
    plain = placements([node("a")], [pod("whole", WHOLE)], "hami")["ml/whole"]
    assert plain.node == "a" and plain.hami_devices == ""


@pytest.mark.parametrize("annotations, limits", [
    (KAI, None), ({"alibabacloud.com/gpu-milli": "500"}, None),
    (None, {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "4000"}),
])
def test_hami_refuses_a_share_its_plugin_cannot_serve(annotations, limits):
    got = placements([node("h", hami=["GPU-h0", "GPU-h1"])], [pod("p", limits, annotations)], "hami")["ml/p"]
    assert got.node is None
    assert "1 node(s) cannot hand over a share asked this way: HAMi's device plugin serves only containers asking " \
           "nvidia.com/gpu" in got.reason


def test_trust_places_shares_anywhere_as_before():
    got = placements([node("a")], [pod("kai", annotations=KAI), pod("hami", HAMI_SHARE)], "trust")
    assert got["ml/kai"].node == "a" and got["ml/hami"].node == "a"
    assert got["ml/kai"].hami_devices == "" and got["ml/hami"].hami_devices == ""


def test_a_node_that_registers_hami_later_takes_the_share():
    """The registration appears on a node already known (a watch update): the share is placed there next cycle."""
    from gpupool.k8s.state import ClusterModel  # the model with cycle(), as the live scheduler uses it

    m = ClusterModel(share_enforcement="hami")
    m.replace("nodes", [node("h", gpus=2)])
    m.replace("pods", [pod("hami", HAMI_SHARE)])
    (first,) = m.cycle().placements
    assert first.node is None and "registered on no node" in first.reason
    later = node("h", hami=["GPU-h0", "GPU-h1"])
    later["status"]["allocatable"]["nvidia.com/gpu"] = "2"  # same capacity: only the registration is new
    later["metadata"]["resourceVersion"] = "2"
    m.apply("nodes", "MODIFIED", later)
    (second,) = m.cycle().placements
    assert second.node == "h" and second.hami_devices.startswith("GPU-h")


# ------------------------------------------------------------------ settings
def test_modes_config_key_and_flags(tmp_path):
    assert SHARE_ENFORCEMENT_MODES == ("none", "hami", "trust")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("apiVersion: gpupool.io/v1alpha1\nkind: GpupoolSchedulerConfiguration\nshareEnforcement: hami\n")
    assert load_config(cfg).share_enforcement == "hami"
    cfg.write_text("shareEnforcement: kai\n")
    with pytest.raises(ConfigError, match=r"shareEnforcement: 'kai': expected none, hami, trust"):
        load_config(cfg)
    runner = CliRunner()
    bad = runner.invoke(app, ["scheduler", "--dry-run", "--snapshot", str(cfg), "--share-enforcement", "yes"])
    assert bad.exit_code == 2 and "--share-enforcement 'yes': expected none, hami, trust" in bad.output
    bad = runner.invoke(app, ["extender", "--share-enforcement", "yes"])
    assert bad.exit_code == 2 and "expected none, hami, trust" in bad.output


def test_dry_run_default_refuses_the_readmes_quarter_gpu(tmp_path):
    from pathlib import Path

    snapshot = Path(__file__).resolve().parents[1] / "examples" / "snapshots" / "cluster.yaml"
    runner = CliRunner()
    out = runner.invoke(app, ["scheduler", "--dry-run", "--snapshot", str(snapshot), "--json", "-"])
    assert out.exit_code == 0, out.output
    by_pod = {p["pod"]: p for p in json.loads(out.stdout)["placements"]}
    quarter = by_pod["ml/notebook-quarter-gpu"]
    assert quarter["node"] is None and "--share-enforcement hami" in quarter["reason"]
    assert by_pod["ml/ddp-0"]["node"] is not None  # whole GPUs are placed


# ------------------------------------------------------------------ the live scheduler, against the mock API
def bound(h, name: str) -> str | None:
    return ((h.pod(name, "ml") or {}).get("spec") or {}).get("nodeName")


@pytest.fixture()
def h():
    from test_k8s_scheduler import Harness

    harness = Harness()
    yield harness
    harness.close()


def test_live_hami_binding_writes_hamis_keys_and_takes_then_waits_on_its_node_lock(h):
    """With ``hami``: the Binding carries HAMi's keys, HAMi's node lock names the pod being handed over; a second
    HAMi pod for the same node waits until HAMi's plugin releases the lock (done here by hand, as the plugin's
    ``PodAllocationSuccess`` does: bind-phase success, lock removed), then binds."""
    from test_k8s_scheduler import wait_for

    h.create_node(node("h", hami=["GPU-h0", "GPU-h1"]))
    h.create_node(node("plain", gpus=4))
    h.create_pod(pod("first", HAMI_SHARE))
    h.scheduler(share_enforcement="hami")
    wait_for(lambda: bound(h, "first") == "h", what="first bound to the HAMi node")
    ann = h.pod("first", "ml")["metadata"]["annotations"]
    gpu = int(ann["gpupool.io/gpu-index"])
    assert ann["hami.io/vgpu-node"] == "h" and ann["hami.io/bind-phase"] == "allocating"
    assert ann["hami.io/vgpu-devices-to-allocate"] == f"GPU-h{gpu},NVIDIA,10000,30:;"
    assert ann["hami.io/vgpu-devices-allocated"] == ann["hami.io/vgpu-devices-to-allocate"]
    assert ann["hami.io/bind-time"].isdigit() and ann["hami.io/vgpu-time"].isdigit()

    def lock() -> str | None:
        found = next(n for n in h.objects(NODES) if n["metadata"]["name"] == "h")
        return (found["metadata"].get("annotations") or {}).get("hami.io/mutex.lock")

    assert parse_node_lock(lock() or "")[1:] == ("ml", "first")
    h.create_pod(pod("second", HAMI_SHARE))
    wait_for(lambda: any(s.assumed.get("ml/second") for s in h.schedulers), what="second placed")
    assert bound(h, "second") is None and parse_node_lock(lock() or "")[1:] == ("ml", "first")
    # HAMi's device plugin served "first": it marks the pod and releases the lock
    h.v1.patch_namespaced_pod("first", "ml", {"metadata": {"annotations": {"hami.io/bind-phase": "success"}}},
                              _preload_content=False)
    h.v1.patch_node("h", {"metadata": {"annotations": {"hami.io/mutex.lock": None}}},
                    _content_type="application/merge-patch+json", _preload_content=False)
    wait_for(lambda: bound(h, "second") == "h", what="second bound once the lock is free")
    assert parse_node_lock(lock() or "")[1:] == ("ml", "second")
    assert h.pod("second", "ml")["metadata"]["annotations"]["hami.io/vgpu-devices-to-allocate"].startswith("GPU-h")


def test_live_none_reports_the_reason_on_the_pod(h):
    from test_k8s_scheduler import wait_for

    h.create_node(node("plain", gpus=4))
    h.create_pod(pod("frac", annotations=KAI))
    h.create_pod(pod("whole", WHOLE))
    h.scheduler(share_enforcement="none")
    wait_for(lambda: bound(h, "whole") == "plain", what="whole GPU bound")
    failed = wait_for(lambda: [e for e in h.events_for("frac") if e["reason"] == "FailedScheduling"], what="event")
    assert "1 node(s) had no mechanism enforcing a GPU share" in failed[0]["message"]
    cond = wait_for(lambda: [c for c in (h.pod("frac", "ml").get("status") or {}).get("conditions") or []
                             if c["type"] == "PodScheduled"], what="condition")
    assert cond[0]["reason"] == "Unschedulable" and "--share-enforcement hami" in cond[0]["message"]
    assert bound(h, "frac") is None


def test_extender_filters_shares_by_mode_and_binds_through_hami(h):
    """The extender: ``none`` fails every node for a share with the reason, ``hami`` keeps the HAMi node only;
    its bind writes HAMi's keys on the pod and takes HAMi's node lock before the Binding."""
    from gpupool.k8s.extender import Extender, NodeCache

    nodes = [node("h", hami=["GPU-h0", "GPU-h1"]), node("plain", gpus=4)]
    share = pod("share", HAMI_SHARE)
    args = {"Pod": share, "NodeNames": ["h", "plain"]}
    none = NodeCache(None, share_enforcement="none")
    none.load(nodes, [])
    out = Extender(none).filter(args)
    assert out["NodeNames"] == [] and set(out["FailedNodes"]) == {"h", "plain"}
    assert "install HAMi's device plugin" in out["FailedNodes"]["plain"]
    whole = Extender(none).filter({"Pod": pod("whole", WHOLE), "NodeNames": ["h", "plain"]})
    assert whole["NodeNames"] == ["h", "plain"]

    for n in nodes:
        h.create_node(n)
    h.create_pod(share)
    cache = NodeCache(h.v1, share_enforcement="hami")
    cache.refresh()
    ext = Extender(cache, h.v1, scheduler_names=("gpupool",))  # the pod's schedulerName
    out = ext.filter(args)
    assert out["NodeNames"] == ["h"] and "HAMi's device plugin has not registered there" in out["FailedNodes"]["plain"]
    assert ext.bind({"PodName": "share", "PodNamespace": "ml", "PodUID": "uid-share", "Node": "h"}) == {"Error": ""}
    ann = h.pod("share", "ml")["metadata"]["annotations"]
    assert ann["hami.io/vgpu-node"] == "h" and ann["hami.io/vgpu-devices-to-allocate"].endswith(",NVIDIA,10000,30:;")
    assert bound(h, "share") == "h"
    locked = next(n for n in h.objects(NODES) if n["metadata"]["name"] == "h")["metadata"]["annotations"]
    assert parse_node_lock(locked["hami.io/mutex.lock"])[1:] == ("ml", "share")


def test_node_lock_is_taken_over_as_hamis_lock_node_does(h):
    """nodelock.LockNode: a fresh lock held by an existing pod blocks; one whose pod is gone, or older than 5
    minutes, is taken over; the pod's own lock is kept; release removes only the pod's own lock."""
    import time

    from gpupool.k8s.api.hami_lock import release_node_lock, take_node_lock

    h.create_node(node("h", hami=["GPU-h0"]))
    h.create_pod(pod("holder", WHOLE))

    def set_lock(value: str | None) -> None:
        h.v1.patch_node("h", {"metadata": {"annotations": {"hami.io/mutex.lock": value}}},
                        _content_type="application/merge-patch+json", _preload_content=False)

    def lock() -> str | None:
        found = next(n for n in h.objects(NODES) if n["metadata"]["name"] == "h")
        return (found["metadata"].get("annotations") or {}).get("hami.io/mutex.lock")

    now = time.time()
    set_lock(node_lock_value("ml", "holder", now))
    why = take_node_lock(h.api, "h", "ml", "new", now)
    assert why == "HAMi's node lock on h is held by pod ml/holder (its devices are being handed over)"
    assert take_node_lock(h.api, "h", "ml", "holder", now) == "" and parse_node_lock(lock())[2] == "holder"
    assert not release_node_lock(h.api, "h", "ml", "new") and lock() is not None  # not its lock
    set_lock(node_lock_value("ml", "ghost", now))  # its pod is gone
    assert take_node_lock(h.api, "h", "ml", "new", now) == "" and parse_node_lock(lock())[2] == "new"
    set_lock(node_lock_value("ml", "holder", now - 301))  # expired
    assert take_node_lock(h.api, "h", "ml", "new", now) == "" and parse_node_lock(lock())[2] == "new"
    assert release_node_lock(h.api, "h", "ml", "new") and lock() is None
    set_lock("not a lock")
    assert "is not an RFC 3339 time" in take_node_lock(h.api, "h", "ml", "new", now)
