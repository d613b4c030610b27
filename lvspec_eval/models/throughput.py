"""lmms-eval's own speed fields: results["throughput"] of its results JSON.

lmms-eval 0.7.3 fills them from `gen_metrics.log_metrics(total_elapsed_time, total_gen_tokens,
avg_speed, additional_metrics)`, which its own model classes call once per `generate_until` (e.g.
models/chat/qwen2_5_vl.py: generation seconds, generated tokens, tokens/s, and the rank), and
summarises on rank 0 (sums of seconds and tokens, `avg_<key>` of each additional number over the
calls). We call it the same way with the samples decoded in the call: elapsed = the sum of their
end-to-end seconds, and as additional metrics what a speculative run adds (tau, tokens per step,
the share of decode time spent drafting, decode and end-to-end seconds), plus how many samples the
call served from the stats file of a resumed run (models/resume.py) and how many failed.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Throughput:
    """The decoded samples' figures of one generate_until call."""

    method: str
    records: list[dict] = field(default_factory=list)  # Generation.stats of each decoded sample
    served: int = 0  # answered from the stats file of a resumed run (no decode, no time)
    failed: int = 0

    def metrics(self, rank: int) -> dict:
        """log_metrics' keyword arguments."""
        total = lambda key: float(sum(r.get(key) or 0.0 for r in self.records))
        elapsed, tokens, decode_s = total("e2e_s"), int(total("num_new_tokens")), total("decode_s")
        steps = total("num_steps")
        tau = sum(sum(r.get("accepted_lengths") or ()) for r in self.records) / steps if steps else 0.0
        extra = {"rank": rank, "method": self.method, "total_requests": len(self.records), "tau": tau,
                 "tokens_per_step": tau + 1 if steps else 0.0,
                 "draft_share": total("draft_s") / decode_s if decode_s > 0 else 0.0,
                 "decode_s": decode_s, "e2e_s": elapsed,
                 "decode_tokens_per_s": tokens / decode_s if decode_s > 0 else 0.0,
                 "served_from_stats": self.served, "failed": self.failed}
        return {"total_elapsed_time": elapsed, "total_gen_tokens": tokens,
                "avg_speed": tokens / elapsed if elapsed > 0 else 0.0, "additional_metrics": extra}

    def log(self, rank: int) -> None:
        from lmms_eval.models.model_utils.gen_metrics import log_metrics

        log_metrics(**self.metrics(rank))
