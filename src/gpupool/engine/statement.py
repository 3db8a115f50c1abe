"""Gang transactions: place several pods all or nothing (Volcano's ``Statement``, KAI's gang commit).

A :class:`Statement` places pods one by one through the engine, so each sees the resources the
previous ones took; :meth:`Statement.commit` keeps them, :meth:`Statement.discard` releases them in
reverse order and leaves the cluster exactly as it was. Because a gang either gets every member at
once or holds nothing, two gangs can never each hold part of what the other needs (no deadlock of
the scheduler-plugins #114 kind).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpupool.engine.core import Decision, Engine
from gpupool.model import Assignment, PodRequest


class Statement:
    """Tentative placements on one engine; commit or discard (once)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.placed: list[Assignment] = []
        self.closed = False

    def place(self, req: PodRequest) -> Decision:
        """Place one member; a failed member changes nothing."""
        if self.closed:
            raise RuntimeError("statement already committed or discarded")
        decision = self.engine.place(req)
        if decision.assignment is not None:
            self.placed.append(decision.assignment)
        return decision

    def commit(self) -> list[Assignment]:
        self.closed = True
        return list(self.placed)

    def discard(self) -> None:
        for assignment in reversed(self.placed):
            self.engine.release(assignment.pod)
        self.placed.clear()
        self.closed = True


def place_gang(engine: Engine, members: Sequence[PodRequest], min_member: int | None = None
               ) -> tuple[list[Assignment], str]:
    """Place ``members`` in order until all are placed or one fails.

    Returns (assignments, "") when at least ``min_member`` (default: all) were placed — the rest are
    left unplaced — or ([], reason) after discarding everything when fewer could be placed.
    """
    need = len(members) if min_member is None else min_member
    if not 0 <= need <= len(members):
        raise ValueError(f"min_member {need} outside 0..{len(members)}")
    st = Statement(engine)
    reason = ""
    for req in members:
        decision = st.place(req)
        if decision.assignment is None:
            reason = f"{req.name}: {decision.reason}"
            if len(st.placed) >= need:
                break
            st.discard()
            return [], reason
    return st.commit(), ""
