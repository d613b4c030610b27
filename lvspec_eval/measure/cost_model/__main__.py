"""`python -m lvspec_eval.measure.cost_model`."""
from .cli import main

raise SystemExit(main())
