"""What the pool driver keeps per job and per held or evicted pod across cycles (plain records, no
behaviour); imports nothing of gpupool."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

EVICTED_BOOKS_S = 3600.0
"""How long (seconds) the books of a job gpupool evicted wait for its controller to re-create its pods."""


@dataclass
class Held:
    """A placement gpupool holds (assumed in the model) but does not bind yet: victims still on its node."""

    node: str
    since: float
    pid: int | None
    job: str = ""  # its job: a gang binds together, when no member's node has victims left (all or nothing)


@dataclass
class Evicting:
    uid: str
    node: str
    deadline: float
    pid: int
    job: str = ""  # the victim's job: job_of forgets its pods at the eviction, a lapse still protects the job


@dataclass
class JobInfo:
    """What the driver keeps per job name across cycles and scheduler rebuilds."""

    members: set[str] = field(default_factory=set)
    submit: float = math.nan  # when the job was first seen (its oldest pod's creation): job order, never reset
    restarted: bool = False  # it ran before: its wait counts from its pods' re-creation (an eviction)
    attained: float = 0.0  # GPU-seconds of service before the current run (while it runs: see run_since)
    run_since: float = math.nan  # when its current run began, kept across a scheduler rebuild (nan: none)
    protected_until: float = -math.inf
    spec: tuple = ()
    limit_s: float | None = None  # the run-time limit it declared (seconds), and the largest size estimate
    estimate: float = 0.0  # (GPU-s) it had under that limit: a gang that shrank or lost a finished pod keeps it
    evicted: str = ""  # gpupool evicted it and it has not run since: its identity (job_identity), else ""
    evicted_attained: float = 0.0  # its service (GPU-s) when evicted: what it waits and runs again with on
    # re-created pods (attained stays the service before the evicted run, for a lapse)
    evicted_uids: frozenset = frozenset()  # the uids of the pods evicted: those back (a lapse) ran before
    evicted_at: float = math.nan  # when it was evicted: a lapse or a refusal continues that run from then
    run_uids: frozenset = frozenset()  # the uids of the pods its current run is on (new pods: a new job)
