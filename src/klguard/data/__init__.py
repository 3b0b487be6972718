"""Data for RL training: the built-in arithmetic task and the verl-format parquet loader."""
