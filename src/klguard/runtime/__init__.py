"""Infrastructure of a run: atomic checkpoints, profiling, trackers, preemption signals, seeding."""
