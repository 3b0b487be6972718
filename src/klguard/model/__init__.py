"""Hugging Face models: loading and checking folders, precision, and the forward arguments of each model type."""
