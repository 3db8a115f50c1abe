"""The pool scheduler's eviction actions: reclaim, preempt, elastic grow/shrink, and the shared victim
solver's verification. A mixin of :class:`gpupool.engine.pool.scheduler.PoolScheduler` (it uses that
class's books); split out so that each file stays readable. No I/O.

Every eviction goes through :meth:`EvictionActions._solve`: choose victims with
:func:`~gpupool.engine.pool.victims.select_victims`, release them, place the preemptor through the engine,
then put back (on exactly their old devices) the victims the placement did not need; if the preemptor
cannot be placed, every victim is put back and nothing happened (all or nothing).

One mixin per action, one module each: :mod:`.solver`, :mod:`.candidates`, :mod:`.reclaim`, :mod:`.preempt`,
:mod:`.consolidate`, :mod:`.grow` (composed here as :class:`EvictionActions`), and :mod:`.place`,
:mod:`.allocate`, :mod:`.reserve` (the placing actions).
"""

from __future__ import annotations

from gpupool.engine.pool.actions.allocate import AllocateAction
from gpupool.engine.pool.actions.candidates import VictimCandidates
from gpupool.engine.pool.actions.consolidate import ConsolidateAction
from gpupool.engine.pool.actions.grow import GrowAction
from gpupool.engine.pool.actions.place import PlaceAction
from gpupool.engine.pool.actions.preempt import PreemptAction
from gpupool.engine.pool.actions.reclaim import ReclaimAction
from gpupool.engine.pool.actions.reserve import ReserveAction
from gpupool.engine.pool.actions.solver import Candidate, VictimSolver

__all__ = ["AllocateAction", "Candidate", "ConsolidateAction", "EvictionActions", "GrowAction", "PlaceAction",
           "PreemptAction", "ReclaimAction", "ReserveAction", "VictimCandidates", "VictimSolver"]


class EvictionActions(VictimSolver, VictimCandidates, ReclaimAction, PreemptAction, ConsolidateAction, GrowAction):
    """Reclaim, preempt and elastic actions (mixin; see the module docstring)."""
