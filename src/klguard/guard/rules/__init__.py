"""The guard's rules and signals, one declaration a module: each calls `klguard.guard.registry.register`, and the
registry imports every module here the first time it is asked for the rules. A new rule or signal is a new module
here and its test (docs/architecture.md says how)."""

from klguard.guard.rules.nonfinite import NONFINITE_INPUTS  # klguard.integrations.logs reads it from here

__all__ = ["NONFINITE_INPUTS"]
