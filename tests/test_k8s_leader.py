"""Leader election: replicas contending for a Lease on a kmock API server over real HTTP.

kmock's emulator stores objects but neither versions them nor serves PUT; the API server does both,
and leader election relies on it (a replace carrying a stale ``resourceVersion`` gets ``409``). The
:class:`ApiServer` below adds exactly that, as kmock's docs suggest for special semantics.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import os
import re
import socket
import time

import aiohttp.web
import attrs
import kmock
import pytest
from kubernetes import client

from gpupool.k8s.leader import LeaderElector

NS, NAME = "gpupool-system", "gpupool-scheduler"


def _status(code: int, reason: str, message: str) -> aiohttp.web.Response:
    return aiohttp.web.json_response({"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
                                      "code": code, "reason": reason, "message": message}, status=code)


@attrs.define(kw_only=True)
class ApiServer(kmock.KubernetesEmulator):
    """kmock's emulator plus resourceVersion on every write and optimistic concurrency on replace (PUT)."""

    _versions: itertools.count = attrs.field(factory=lambda: itertools.count(1), init=False)

    async def _handle(self, request):
        data = request.data if isinstance(request.data, dict) else None
        if request.resource is not None and data is not None and request.method == kmock.method.POST \
                and request.name is None:
            data.setdefault("metadata", {})["resourceVersion"] = str(next(self._versions))
        elif request.resource is not None and data is not None and request.method == kmock.method.PATCH:
            data.setdefault("metadata", {})["resourceVersion"] = str(next(self._versions))
        elif request.resource is not None and data is not None and request.method == kmock.method.PUT \
                and request.name and not request.subresource:
            key = (request.resource, request.namespace, request.name)
            async with self._lock:
                if key not in self._objects or self._objects[key].deleted:
                    return _status(404, "NotFound", f"{request.name} not found")
                stored = self._objects[key]
                sent = (data.get("metadata") or {}).get("resourceVersion")
                if sent and sent != stored.raw["metadata"].get("resourceVersion"):
                    return _status(409, "Conflict", "the object has been modified; please apply your changes "
                                                    "to the latest version and try again")
                new = copy.deepcopy(data)
                new.setdefault("metadata", {})["resourceVersion"] = str(next(self._versions))
                stored.create(new)  # a new version that replaces the old one whole
                await self._buses[request.resource].put({"type": "MODIFIED", "object": new})
            return aiohttp.web.json_response(new)
        return await super()._handle(request)


def _api(server) -> client.CoordinationV1Api:
    config = client.Configuration(host=str(server.url).rstrip("/"))
    config.retries = 0
    return client.CoordinationV1Api(client.ApiClient(config))


def _lease(server) -> dict:
    return server.objects[kmock.resource("coordination.k8s.io", "v1", "leases"), NS, NAME].raw


_LIVE: list[LeaderElector] = []


@pytest.fixture(autouse=True)
def _stop_electors():
    """Stop every elector a test started, even when it fails: no thread outlives its test."""
    yield
    while _LIVE:
        elector = _LIVE.pop()
        elector._stop.set()  # signal only: joining here could block the test server's loop


class Replica:
    """One scheduler replica: an elector plus a log of when it started and stopped leading."""

    def __init__(self, server, name: str, **timing) -> None:
        self.events: list[tuple[str, float]] = []
        self.elector = LeaderElector(
            _api(server), name=NAME, namespace=NS, identity=name,
            on_started_leading=lambda: self.events.append(("start", time.monotonic())),
            on_stopped_leading=lambda: self.events.append(("stop", time.monotonic())),
            **(timing or {"lease_duration": 1.2, "renew_deadline": 0.6, "retry_period": 0.1}),
        )
        _LIVE.append(self.elector)

    def partition(self, url: str = "http://127.0.0.1:9") -> None:
        """Cut this replica off the API server (by default: connection refused from now on)."""
        self.elector.api.api_client.configuration.host = url


async def _until(predicate, timeout: float) -> bool:
    """Poll until ``predicate()``; ``timeout`` is a ceiling, scaled as tests/test_k8s_scheduler.py's wait_for."""
    deadline = time.monotonic() + timeout * float(os.environ.get("GPUPOOL_TEST_WAIT_SCALE", "6"))
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.02)
    return predicate()


async def _watch_single_leader(replicas, seconds: float) -> set[str]:
    """Sample for ``seconds``; assert never two leaders at once; return who led."""
    leaders: set[str] = set()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        now = [r.elector.identity for r in replicas if r.elector.is_leader]
        assert len(now) <= 1, f"two leaders at once: {now}"
        leaders.update(now)
        await asyncio.sleep(0.02)
    return leaders


@pytest.mark.asyncio
@pytest.mark.kmock(cls=ApiServer)
async def test_one_leads_and_the_other_takes_over_when_it_stops_renewing(kmock):
    a, b = Replica(kmock, "replica-a"), Replica(kmock, "replica-b")
    a.elector.start()
    assert await _until(lambda: a.elector.is_leader, 3)
    b.elector.start()
    assert await _watch_single_leader([a, b], 1.5) == {"replica-a"}  # > lease_duration: b waits, a renews
    assert b.elector.leader == "replica-a" and not b.elector.is_leader
    lease = _lease(kmock)
    assert lease["spec"]["holderIdentity"] == "replica-a" and lease["spec"]["leaseTransitions"] == 0
    for field in ("renewTime", "acquireTime"):  # MicroTime: the API server wants six fraction digits
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|\+00:00)", lease["spec"][field])

    # a keeps running but its requests hang: a server that accepts connections and never answers.
    with socket.socket() as black_hole:
        black_hole.bind(("127.0.0.1", 0))
        black_hole.listen(64)
        t_cut = time.monotonic()
        a.partition(f"http://127.0.0.1:{black_hole.getsockname()[1]}")
        assert await _until(lambda: not a.elector.is_leader, 2)
        # renew deadline 0.6 s; the slack absorbs scheduling jitter on a loaded CI machine (the safety
        # property, a stepping down before b starts, is checked exactly below)
        assert time.monotonic() - t_cut < 0.6 + 1.4, "a hung renewal must not outlast the renew deadline"
        assert await _until(lambda: b.elector.is_leader, 4)
        assert await _until(lambda: a.events[-1][0] == "stop", 2)
    # is_leader turns True before the start callback has run on its thread: wait for the callback too
    assert await _until(lambda: any(kind == "start" for kind, _ in b.events), 2)
    a_stop = next(t for kind, t in a.events if kind == "stop")
    b_start = next(t for kind, t in b.events if kind == "start")
    assert a_stop < b_start, "the old leader must step down before the new one starts"
    assert not a.elector.is_leader
    lease = _lease(kmock)
    assert lease["spec"]["holderIdentity"] == "replica-b" and lease["spec"]["leaseTransitions"] == 1
    assert await _watch_single_leader([a, b], 0.5) == {"replica-b"}

    await asyncio.to_thread(a.elector.stop)
    await asyncio.to_thread(b.elector.stop)  # the API server runs on this loop: never block it
    assert _lease(kmock)["spec"]["holderIdentity"] == ""  # b released it on the way out
    assert [k for k, _ in b.events] == ["start", "stop"]


@pytest.mark.asyncio
@pytest.mark.kmock(cls=ApiServer)
async def test_simultaneous_start_elects_exactly_one_and_release_hands_over_fast(kmock):
    timing = {"lease_duration": 5.0, "renew_deadline": 3.0, "retry_period": 0.1}
    replicas = [Replica(kmock, f"replica-{i}", **timing) for i in range(3)]
    for r in replicas:
        r.elector.start()
    assert await _until(lambda: any(r.elector.is_leader for r in replicas), 3)
    (first,) = await _watch_single_leader(replicas, 0.6)
    leader = next(r for r in replicas if r.elector.identity == first)

    t0 = time.monotonic()
    await asyncio.to_thread(leader.elector.stop)
    rest = [r for r in replicas if r is not leader]
    assert await _until(lambda: any(r.elector.is_leader for r in rest), 2)
    assert time.monotonic() - t0 < timing["lease_duration"], "a released Lease is taken without waiting it out"
    (second,) = await _watch_single_leader(rest, 0.3)
    assert second != first and _lease(kmock)["spec"]["leaseTransitions"] == 1
    for r in rest:
        await asyncio.to_thread(r.elector.stop)
    assert all(not r.elector.is_leader for r in replicas)


@pytest.mark.asyncio
@pytest.mark.kmock(cls=ApiServer)
async def test_stale_write_is_refused_and_lost_lease_steps_down(kmock):
    seen: list[str] = []
    a = LeaderElector(_api(kmock), name=NAME, namespace=NS, identity="a", lease_duration=1.0,
                      renew_deadline=0.6, retry_period=0.1, on_new_leader=seen.append,
                      on_started_leading=lambda: 1 / 0)  # a failing callback is logged, not fatal
    assert await asyncio.to_thread(a.try_acquire_or_renew)
    stale_rv = _lease(kmock)["metadata"]["resourceVersion"]
    assert await asyncio.to_thread(a.try_acquire_or_renew)  # renew bumps the version
    assert _lease(kmock)["metadata"]["resourceVersion"] != stale_rv

    api = _api(kmock)
    body = {"metadata": {"name": NAME, "namespace": NS, "resourceVersion": stale_rv},
            "spec": {"holderIdentity": "intruder"}}
    with pytest.raises(client.ApiException) as err:
        await asyncio.to_thread(api.replace_namespaced_lease, NAME, NS, body)
    assert err.value.status == 409 and _lease(kmock)["spec"]["holderIdentity"] == "a"

    # Someone takes the Lease over behind a's back: a leader that sees it steps down at once.
    a.start()
    assert await _until(lambda: a.is_leader, 2)
    current = _lease(kmock)
    body = {"metadata": {"name": NAME, "namespace": NS, "resourceVersion": current["metadata"]["resourceVersion"]},
            "spec": {**current["spec"], "holderIdentity": "b"}}
    await asyncio.to_thread(api.replace_namespaced_lease, NAME, NS, body)
    assert await _until(lambda: not a.is_leader, 0.5)
    assert a.leader == "b" and seen[:2] == ["a", "b"]
    await asyncio.to_thread(a.stop)
    assert _lease(kmock)["spec"]["holderIdentity"] == "b"  # not ours to release


def test_timing_must_be_ordered():
    for bad in [(10, 10, 2), (15, 10, 10), (15, 10, 0)]:
        with pytest.raises(ValueError):
            LeaderElector(client.CoordinationV1Api(client.ApiClient(client.Configuration())),
                          lease_duration=bad[0], renew_deadline=bad[1], retry_period=bad[2])


def test_micro_time_always_has_six_fraction_digits():
    import datetime as dt

    from gpupool.k8s.api.leader import _micro_time

    assert _micro_time(dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.UTC)) == "2025-01-02T03:04:05.000001Z"
    assert _micro_time("2025-01-02T03:04:05.250000+00:00") == "2025-01-02T03:04:05.250000Z"
    lease = client.V1Lease(spec=client.V1LeaseSpec(renew_time=_micro_time(dt.datetime(2025, 1, 2, tzinfo=dt.UTC))))
    assert client.ApiClient().sanitize_for_serialization(lease)["spec"]["renewTime"].startswith("2025-01-02T00:00:00.")
