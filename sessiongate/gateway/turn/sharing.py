"""What a turn shares with the other gateway replicas, decided once when the gateway is assembled (`wiring.py`).

A turn touches the replicas' shared state (`gateway.shared`) at four points: its admission (the tenant's token
bucket), before routing (the claim of the session's advisory and its KV belief), the charge of its tokens when it
ends, and after it (the session's KV belief, for the next turn's replica). `OneReplica` does each in this
process alone, with no await that suspends; `Replicas` does each through the shared state (each call falls back
to this replica's own state while the shared one does not answer). The chat path (`chat.py`, `context.py`) calls
`GatewayState.sharing` and never asks which one it has.
"""

from __future__ import annotations

from sessiongate.gateway.advisor import Advisor
from sessiongate.gateway.routing.router import Router
from sessiongate.gateway.shared import SharedState

from .limits import Admission, TenantLimits

__all__ = ["OneReplica", "Replicas", "turn_sharing"]


class OneReplica:
    """One gateway process: the turn's admission, advisory, charge and KV belief stay here."""

    def __init__(self, *, limits: TenantLimits, router: Router, advisor: Advisor) -> None:
        self.limits = limits
        self.router = router
        self.advisor = advisor

    async def admit(self, tenant_id: str) -> Admission:
        """Admit one turn of the tenant, or raise `RateLimited`."""
        return self.limits.admit(tenant_id)

    async def before_routing(self, session_id: str) -> None:
        """Before the turn is routed: nothing to claim from elsewhere."""

    async def charge(self, admission: Admission, tokens: int) -> None:
        """Charge the tokens the turn used to its tenant."""
        admission.charge(tokens)

    async def after_turn(self, session_id: str) -> None:
        """The turn ended: nothing to publish."""


class Replicas(OneReplica):
    """Replicas sharing state: the next turn of a session may land on another replica."""

    async def admit(self, tenant_id: str) -> Admission:
        return await self.limits.admit_shared(tenant_id)

    async def before_routing(self, session_id: str) -> None:
        # Claim the session's advisory (wherever it was made) and read its KV belief.
        await self.advisor.prepare_turn(session_id)

    async def charge(self, admission: Admission, tokens: int) -> None:
        await admission.charge_shared(tokens)

    async def after_turn(self, session_id: str) -> None:
        await self.router.publish_kv(session_id)


def turn_sharing(shared: SharedState, *, limits: TenantLimits, router: Router, advisor: Advisor) -> OneReplica:
    """The one place the turn path's "are we running replicas?" is asked."""
    kind = Replicas if shared.distributed else OneReplica
    return kind(limits=limits, router=router, advisor=advisor)
