"""Refusals that read as decisions: a gate that blocks a move, or a move another one beat.

Both are the system working, not crashing: the run ends Failed (so ``state.is_failed()`` and
exit codes of scripts still say "did not move"), but under a name the runs list shows
("Blocked by gate", "Lost race"), with one log line holding the reasons and the fix, and no
traceback. Anything else (a bug, a store that is down) still raises and shows its traceback.

The pointer-moving tasks return a :class:`Refused` instead of raising, because a raising task
logs its traceback before the flow could decide what the exception means.
"""

from __future__ import annotations

from dataclasses import dataclass

from prefect import get_run_logger
from prefect.states import Failed, State

from k3artifacts.errors import Conflict, GateFailed, K3AError

BLOCKED = "Blocked by gate"
LOST_RACE = "Lost race"


@dataclass(frozen=True)
class Refused:
    """A move the library declined, as plain values (it crosses the task boundary)."""

    state_name: str
    message: str
    hint: str | None

    @classmethod
    def of(cls, exc: K3AError) -> Refused:
        name = BLOCKED if isinstance(exc, GateFailed) else LOST_RACE
        return cls(name, str(exc), exc.hint)

    def one_line(self) -> str:
        text = "; ".join(line.strip() for line in self.message.splitlines() if line.strip())
        return text + (f" next: {self.hint}" if self.hint else "")


#: The library errors that are decisions; the tasks catch exactly these.
DECISIONS = (GateFailed, Conflict)


def end_refused(refused: Refused) -> State:
    """Log the refusal in one line and return the run's final state."""
    line = refused.one_line()
    get_run_logger().warning("%s: %s", refused.state_name, line)
    return Failed(name=refused.state_name, message=line)
