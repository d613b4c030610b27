"""The report's options (`lvspec-eval report` flags, `build_report(**options)`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields


@dataclass(frozen=True)
class ReportOptions:
    metrics: Mapping[str, str] = field(default_factory=dict)  # task -> metric override
    margin: float = 0.01  # the non-inferiority margin of the "non_inferior" column
    n_boot: int = 2000
    alpha: float = 0.05
    seed: int = 0
    baseline: str = "vanilla"
    echo: bool = False  # print the table to stdout
    plots: bool = True  # draw the PNGs (off: faster, for CI gates that read only summary.json)
    length_tasks: tuple[str, ...] = ()  # rows after the other tasks', in this order (see the docstring)
    lossless_tasks: tuple[str, ...] = ()  # tasks whose recommended method must be lossless (exact output)



def make_options(options: Mapping) -> ReportOptions:
    allowed = [f.name for f in fields(ReportOptions)]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"unknown report option(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}")
    values = {k: v for k, v in options.items() if v is not None}
    if "length_tasks" in values:
        values["length_tasks"] = tuple(values["length_tasks"])
    return ReportOptions(**values)
