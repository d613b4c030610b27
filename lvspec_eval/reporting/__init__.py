"""Reporting, from saved runs only: report (the pages and summary.json), runs (reading them),
overview (summary, leaderboard, time per phase), page (HTML and markdown), plots, policy,
divergence, baseline_run, and check (the CI gate on summary.json)."""
