"""Rewards: rule-based gold rewards (GSM8K's `####` rule), reward models and ensembles, the reward manager."""
