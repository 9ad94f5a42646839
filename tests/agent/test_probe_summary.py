"""The agent's log line for each probe it ran: what the control plane got, for the host's operator
(the terminal said only "Probing deployment 1 at 1 req/s." and then nothing)."""

from __future__ import annotations

from gpu_agent.probe import probe_summary
from gpu_agent.protocol import ProbeReport


def test_a_probe_is_summed_up_in_one_line() -> None:
    report = ProbeReport(
        "p1", "7", ok=True, rate=0.5, num_requests=40, finished=38, ttft_p99_s=None,
        tbt_p99_s=0.0412, ttft_p50_s=0.1234, tbt_p50_s=0.0101, duration_s=83.6,
    )  # fmt: skip
    assert probe_summary(report) == (
        "Probe of deployment 7 at 0.5 req/s: 38 of 40 requests finished in 84 s; TTFT p50/p99 "
        "123 ms/late, TBT p50/p99 10 ms/41 ms."
    )
    # One-token answers have no gap between tokens: not late, there is no figure.
    single = ProbeReport("p3", "7", ok=True, rate=1.0, num_requests=5, finished=5, ttft_p50_s=0.05,
                         ttft_p99_s=0.06, duration_s=5.2)  # fmt: skip
    assert probe_summary(single).endswith("TTFT p50/p99 50 ms/60 ms, TBT p50/p99 n/a/n/a.")


def test_a_probe_that_could_not_run_says_why() -> None:
    report = ProbeReport("p2", "7", ok=False, error="deployment '7' is not running on this host (a)")
    assert probe_summary(report) == (
        "Probe of deployment 7 failed: deployment '7' is not running on this host (a)"
    )
