"""klguard's guard for TRL (extra ``klguard[trl]``): `KLGuardCallback` for ``GRPOTrainer``."""

from klguard.integrations.trl.callback import KLGuardCallback

__all__ = ["KLGuardCallback"]
