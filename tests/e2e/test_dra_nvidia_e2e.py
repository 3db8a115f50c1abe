"""The ResourceSlices and DeviceClasses of gpupool.k8s.objects.dra_nvidia, as the real kube-apiserver takes them.

One node of each preset (and the variants: Ampere with MIG mode off, consumable shares in each mode, the 1.34
one-slice-per-GPU layout) is created through ``resource.k8s.io/v1``; the server's validation (counter-set and
device limits, names, quantities, request policies) must accept every object, and reading them back must give
the same devices, counters and policies.
"""

from __future__ import annotations

import json

import pytest
from kubernetes import client

from gpupool.k8s.objects import dra_nvidia as nv
from gpupool.k8s.objects.dra import parse_device_class, parse_slice

pytestmark = pytest.mark.real_apiserver

VARIANTS = [(p, {}) for p in nv.PRESETS] + [
    ("a100-80gb", {"mig_enabled": False}),
    ("l40s", {"consumable_shares": "memory"}),
    ("l40s", {"consumable_shares": "unlimited"}),
    ("dgx-h100", {"consumable_shares": "4"}),
]


def _create(api: client.ApiClient, plural: str, body: dict) -> tuple[int, dict]:
    """POST through the generic client (plain dicts in and out); (status, object or Status)."""
    try:
        got = client.CustomObjectsApi(api).create_cluster_custom_object("resource.k8s.io", "v1", plural, body)
        return 201, got
    except client.ApiException as e:
        return e.status, json.loads(e.body or b"{}")


def _delete(api: client.ApiClient, plural: str, name: str) -> None:
    try:
        client.CustomObjectsApi(api).delete_cluster_custom_object("resource.k8s.io", "v1", plural, name)
    except client.ApiException:
        pass


def test_device_classes_accepted(admin: client.ApiClient) -> None:
    for obj in nv.nvidia_device_classes():
        status, got = _create(admin, "deviceclasses", obj)
        assert status == 201, (obj["metadata"]["name"], got.get("message"))
        assert parse_device_class(got).selectors == parse_device_class(obj).selectors
        assert got["spec"].get("extendedResourceName") == obj["spec"].get("extendedResourceName")
    for obj in nv.nvidia_device_classes():
        _delete(admin, "deviceclasses", obj["metadata"]["name"])


@pytest.mark.parametrize(("preset", "overrides"), VARIANTS, ids=[f"{p}-{o}" for p, o in VARIANTS])
def test_slices_accepted(admin: client.ApiClient, preset: str, overrides: dict) -> None:
    node = "-".join([f"v-{preset}"] + [f"{k}-{v}".lower().replace("_", "-") for k, v in overrides.items()])
    slices = nv.preset_slices(preset, node, **overrides)
    try:
        for obj in slices:
            status, got = _create(admin, "resourceslices", obj)
            assert status == 201, (obj["metadata"]["name"], got.get("message"))
            mine, theirs = parse_slice(obj), parse_slice(got)
            assert [d.name for d in theirs.devices] == [d.name for d in mine.devices]
            assert theirs.counter_sets == mine.counter_sets
            assert [(d.capacity, d.consumes, d.capacity_policy, d.allow_multiple, d.attributes)
                    for d in theirs.devices] == [(d.capacity, d.consumes, d.capacity_policy, d.allow_multiple,
                                                  d.attributes) for d in mine.devices]
    finally:
        for obj in slices:
            _delete(admin, "resourceslices", obj["metadata"]["name"])


def test_one_slice_per_gpu_layout_is_refused_by_136(admin: client.ApiClient) -> None:
    """The 1.34 layout (counters beside the devices) is what the driver publishes to servers < 1.35 only
    (driver.go shouldUseSplitResourceSlices); 1.36 refuses it, as the driver expects."""
    obj = nv.preset_slices("dgx-h200", "v-h200-134", split_counters=False)[0]
    status, got = _create(admin, "resourceslices", obj)
    if status == 201:
        _delete(admin, "resourceslices", obj["metadata"]["name"])
    assert status == 422 and "only one of `sharedCounters` or `devices` is allowed" in got.get("message", "")
