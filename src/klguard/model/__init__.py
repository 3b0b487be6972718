"""Model helpers for the built-in demo: a character tokenizer and a tiny Llama."""
