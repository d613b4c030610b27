"""Measurement: bench (methods side by side in one process), prompts (its text prompts),
cost_model (real-size random-weight models), sweep (LVSpec thresholds), dry_run (checks without weights),
demo_run (`lvspec-eval demo`: every method through lmms-eval on the demo world, then the report)."""
