"""Rule-based gold rewards (GSM8K's `####` rule) and the demo's length-biased proxy reward."""
