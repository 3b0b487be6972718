"""The guard inside other trainers: TRL's GRPOTrainer (`klguard.integrations.trl`, extra `klguard[trl]`).

Importing this package imports no other trainer: each integration imports its trainer's library in
its own subpackage. `metric_maps` holds the one mapping per trainer from its metric names to klguard's
(verl's) names, which the guard reads.
"""
