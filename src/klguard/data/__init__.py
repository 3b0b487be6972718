"""Data for RL training: the verl-format parquet loader and the prompt sampler."""
