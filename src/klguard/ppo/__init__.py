"""The PPO engine: the loop (trainer), its state, setup, rollout, forwards, updates, scoring, metrics, guard hooks."""
