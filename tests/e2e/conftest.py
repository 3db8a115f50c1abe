"""Fixtures of the end-to-end suite (marker ``real_apiserver``): one real control plane per test session.

Runs only when ``KUBE_APISERVER`` and ``ETCD`` name executable binaries (``make e2e`` finds them); otherwise
every test here is skipped with the reason, so a plain ``pytest`` (CI, no binaries) stays green.
"""

from __future__ import annotations

import logging
import os
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpupool.k8s.wire import drain

from . import livecluster as lc


def _missing() -> str | None:
    problems = []
    for var in ("KUBE_APISERVER", "ETCD"):
        value = os.environ.get(var)
        if not value:
            problems.append(f"${var} is not set")
        elif not (os.path.isfile(value) and os.access(value, os.X_OK)):
            problems.append(f"${var}={value} is not an executable file")
    if not (lc.KCP_TOOLS / "start.sh").exists():
        problems.append(f"{lc.KCP_TOOLS}/start.sh not found (set KCP_TOOLS)")
    if problems:
        return ("real kube-apiserver e2e suite: " + "; ".join(problems)
                + " (run `make e2e`, or set KUBE_APISERVER and ETCD to the binaries)")
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _missing()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if item.get_closest_marker("real_apiserver"):
            item.add_marker(skip)


# ------------------------------------------------------------------ session


@pytest.fixture(scope="session")
def control_plane() -> Iterator[lc.ControlPlane]:
    cp = lc.ControlPlane.start()
    lc.RESULTS["control_plane_start_s"] = round(cp.startup_s, 2)
    print(f"\n[e2e] control plane ready in {cp.startup_s:.2f}s at {cp.server} (state {cp.dir})")
    try:
        yield cp
    finally:
        cp.stop(remove=os.environ.get("E2E_KEEP_STATE") != "1")


@pytest.fixture(scope="session")
def admin(control_plane: lc.ControlPlane) -> client.ApiClient:
    return lc.admin_client(control_plane)


@pytest.fixture(scope="session")
def deployed(admin: client.ApiClient) -> list[str]:
    """deploy/ applied (as `kubectl apply -k deploy/` would), CRDs Established."""
    done = lc.apply_objects(admin, lc.deploy_objects())
    for crd in ("queues.gpupool.io", "podgroups.scheduling.x-k8s.io"):
        lc.wait_for(lambda c=crd: lc.crd_established(admin, c), 30, f"CRD {crd} Established")
    return done


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("e2e-logs")
    print(f"\n[e2e] scheduler logs under {path}")
    return path


@pytest.fixture(scope="session")
def sa_kubeconfig(control_plane: lc.ControlPlane, admin: client.ApiClient, deployed: list[str],
                  log_dir: Path) -> Path:
    """A kubeconfig holding a token of deploy/'s ServiceAccount: the scheduler runs with exactly its RBAC."""
    token = lc.service_account_token(admin)
    return lc.token_kubeconfig(control_plane, token, log_dir / "sa.kubeconfig")


@pytest.fixture(scope="session")
def sa_client(sa_kubeconfig: Path) -> client.ApiClient:
    from kubernetes import config

    return config.new_client_from_config(config_file=str(sa_kubeconfig))


# ------------------------------------------------------------------ the control plane with controllers
WITH_CONTROLLERS = ("kube-controller-manager", "kubelet-sim")


@pytest.fixture(scope="session")
def controllers_plane(control_plane: lc.ControlPlane, admin: client.ApiClient, sa_kubeconfig: Path,
                      sa_client: client.ApiClient, log_dir: Path) -> Iterator[lc.Plane]:
    """A control plane with kube-controller-manager (Deployments, Jobs, GC, the disruption controller) and
    kubelet-sim: the session's own when it runs them (``KCP_WITH=controller-manager,kubelet-sim``), else a second
    one started here with them (about 5 s) and stopped at the end of the session."""
    if all(control_plane.runs(part) for part in WITH_CONTROLLERS):
        yield lc.Plane(control_plane, admin, sa_kubeconfig, sa_client)
        return
    cp = lc.ControlPlane.start(with_parts="controller-manager,kubelet-sim")
    print(f"\n[e2e] control plane with controllers ready in {cp.startup_s:.2f}s at {cp.server} (state {cp.dir})")
    try:
        api = lc.admin_client(cp)
        lc.apply_objects(api, lc.deploy_objects())
        for crd in ("queues.gpupool.io", "podgroups.scheduling.x-k8s.io"):
            lc.wait_for(lambda c=crd: lc.crd_established(api, c), 30, f"CRD {crd} Established")
        kc = lc.token_kubeconfig(cp, lc.service_account_token(api), log_dir / "sa-controllers.kubeconfig")
        from kubernetes import config

        yield lc.Plane(cp, api, kc, config.new_client_from_config(config_file=str(kc)))
    finally:
        cp.stop(remove=os.environ.get("E2E_KEEP_STATE") != "1")


# ------------------------------------------------------------------ per test
@pytest.fixture
def e2e(control_plane: lc.ControlPlane, admin: client.ApiClient, sa_kubeconfig: Path, sa_client: client.ApiClient,
        log_dir: Path, request: pytest.FixtureRequest) -> Iterator[lc.E2E]:
    yield from _context(lc.Plane(control_plane, admin, sa_kubeconfig, sa_client), log_dir, request)


@pytest.fixture
def e2e_ctl(controllers_plane: lc.Plane, log_dir: Path, request: pytest.FixtureRequest) -> Iterator[lc.E2E]:
    """As ``e2e``, on the control plane with the controllers (``controllers_plane``)."""
    yield from _context(controllers_plane, log_dir, request)


def _context(plane: lc.Plane, log_dir: Path, request: pytest.FixtureRequest) -> Iterator[lc.E2E]:
    """One test's namespace and context on ``plane``; its schedulers stopped and its objects removed after it."""
    stem = re.sub(r"[^a-z0-9-]+", "-", request.node.name.removeprefix("test_").replace("_", "-").lower())[:40]
    ns = f"e2e-{stem.strip('-')}-{uuid.uuid4().hex[:4]}"  # an RFC 1123 label, also for parametrized tests
    client.CoreV1Api(plane.admin).create_namespace({"apiVersion": "v1", "kind": "Namespace",
                                                    "metadata": {"name": ns, "labels": {lc.E2E_LABEL: "1"}}})
    ctx = lc.E2E(plane.cp, plane.admin, plane.sa_kubeconfig, plane.sa_client, ns, log_dir)
    logger = logging.getLogger("gpupool")
    old_level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(ctx.logs)
    try:
        yield ctx
    finally:
        logger.removeHandler(ctx.logs)
        logger.setLevel(old_level)
        for sched in ctx.inproc:
            try:
                sched.stop()
            except Exception:  # noqa: BLE001 - teardown goes on
                pass
        for proc in ctx.procs:
            proc.kill()
        _cleanup(ctx)


def _cleanup(ctx: lc.E2E) -> None:
    """Leave the control plane as the next test expects it: apiserver up, no e2e pods, nodes, queues, Lease."""
    if not ctx.cp.ready():
        try:
            ctx.cp.start_apiserver()
        except AssertionError:
            pass
        ctx.cp.wait_ready(60)
    core, custom = client.CoreV1Api(ctx.admin), client.CustomObjectsApi(ctx.admin)

    def pods_gone() -> bool:
        """No pod left in the namespace; those still there (a ReplicaSet's create that was in flight) deleted again."""
        left = lc.list_pods(ctx.admin, ctx.ns)
        if not left:
            return True
        drain(core.delete_collection_namespaced_pod(ctx.ns, grace_period_seconds=0, _preload_content=False))
        for p in left:  # a finalizer a test put on its pods (to keep them Terminating) must not outlive it
            if p["metadata"].get("finalizers") and p["metadata"].get("deletionTimestamp"):
                drain(core.patch_namespaced_pod(p["metadata"]["name"], ctx.ns, {"metadata": {"finalizers": None}},
                                                _preload_content=False))
        return False

    deadline = time.monotonic() + 30
    while True:
        try:
            # With KCP_WITH=controller-manager a workload's controller makes a deleted pod again: the workloads go
            # first (their owners before them: a Deployment's ReplicaSets, a Job's pods), then the pods
            lc.delete_workloads(ctx.admin, ctx.ns)
            drain(core.delete_collection_namespaced_pod(ctx.ns, grace_period_seconds=0, _preload_content=False))
            custom.delete_collection_namespaced_custom_object("scheduling.x-k8s.io", "v1alpha1", ctx.ns, "podgroups")
            custom.delete_collection_cluster_custom_object("gpupool.io", "v1alpha1", "queues",
                                                           label_selector=f"{lc.E2E_LABEL}=1")
            drain(core.delete_collection_node(label_selector=f"{lc.E2E_LABEL}=1", _preload_content=False))
            try:
                client.CoordinationV1Api(ctx.admin).delete_namespaced_lease(lc.LEASE_NAME, lc.SA_NAMESPACE)
            except client.exceptions.ApiException as exc:
                if exc.status != 404:
                    raise
            lc.wait_for(lambda: pods_gone() and not any(
                n["metadata"].get("labels", {}).get(lc.E2E_LABEL) for n in lc.list_nodes(ctx.admin)),
                20, "e2e pods and nodes to be gone", interval=0.2)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if lc.RESULTS:
        terminalreporter.write_sep("-", "gpupool e2e (real kube-apiserver) figures")
        for key, value in lc.RESULTS.items():
            terminalreporter.write_line(f"{key}: {value}")
