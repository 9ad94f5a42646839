"""The seam for profiling a real engine through its host agent (implemented with the agent).

An EngineProbe asks the GPU agent that runs the model's engine to replay the workload at a rate
against that engine and to report back; the profiler does not care how. What an implementation
must return, per call:

  measure(rate)   Replay `WorkloadSpec.requests(rate)` (same requests, same seed) against the
                  engine's OpenAI endpoint, streaming, and report
                    - ttft_p99_s / tbt_p99_s over all requests and all inter-token gaps, a request
                      that fails or produces no token counting as infinitely late;
                    - kv_capacity_bytes: the engine's KV cache size (vLLM: num_gpu_blocks x block
                      bytes) and peak_kv_used_bytes: the highest KV use seen while replaying
                      (vLLM's kv-cache usage gauge x capacity, sampled at least every second);
                    - prefill_samples / decode_samples: (batch composition, seconds) of timed
                      engine iterations, e.g. from a scheduler plug-in's per-step log, so that
                      the profiler can fit a CostModel and calibrate the simulator.
  measure_burst(rate, factor)
                  Either replay `WorkloadSpec.burst_requests(rate, factor)` on the engine and report
                  the KV demand (peak use + bytes preempted at the same moment), or, cheaper and
                  safer on a production engine, answer from a SimulatorProbe built with the
                  fitted cost model and the engine's real capacity.
  kv_bytes_per_token
                  From the model config (2 x layers x KV heads x head dim x dtype bytes).

Errors: an agent that cannot be reached or an engine that fails should raise an exception whose
message names the host and the model; the profiler lets it propagate and returns nothing.
"""

from __future__ import annotations

from abc import abstractmethod

from serving.profiler.probe import BurstResult, ProbeResult, RateProbe


class EngineProbe(RateProbe):
    """A RateProbe backed by a real engine through its agent (see the module docstring)."""

    @abstractmethod
    def measure(self, rate: float) -> ProbeResult:
        """Replay the workload at `rate` on the engine; see the module docstring for the fields."""

    @abstractmethod
    def measure_burst(self, rate: float, factor: float) -> BurstResult:
        """KV demand under a `factor` x burst; see the module docstring."""
