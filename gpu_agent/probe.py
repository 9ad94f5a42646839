"""Profiling probes: replay a workload against one engine and report latency percentiles and KV use.

The control plane sends a `probe` frame (gpu_agent/protocol.py) naming a deployment, a rate and the
requests of the workload at that rate (arrival offsets, prompt and output lengths). `ProbeRunner`
replays them against the engine's OpenAI-compatible ``/v1/completions`` with streaming, each request
sent at its arrival offset with a prompt of exactly `prompt_tokens` token ids (seeded, drawn from the
model's vocabulary, so no tokenizer is needed) and ``max_tokens`` = its output length with
``ignore_eos`` so that it generates exactly that many tokens. Per request it records the time of
every streamed chunk (vLLM streams one chunk per engine step): TTFT = first chunk - send time, and
the gaps between chunks are the time-between-tokens samples.

While replaying it scrapes the engine's ``/metrics`` every `sample_interval_s`:
  - KV capacity = ``vllm:cache_config_info``'s num_gpu_blocks x block_size x KV bytes per token
    (2 x layers x KV heads x head dim x dtype bytes, from the model's config.json);
  - peak KV used = the highest ``vllm:kv_cache_usage_perc`` x capacity, or, when higher, the KV the
    streams prove held at once: a request between its first and its last chunk holds at least its
    prompt and the tokens streamed so far (a lower bound seen at every chunk, so a short run on a
    fast engine is not missed between two scrapes);
  - peak KV demand = the highest (KV used + the prompts of requests sent but not yet answered), the
    memory the engine would hold if nothing had to wait for room (used to size swap under bursts).
Cost-model samples, timed from the client side (approximate: they include the HTTP streaming delay):
  - prefill: a request that ran alone from its send to its first chunk gives ((prompt,), TTFT);
  - decode: the gap between two chunks of a request, when no request was waiting for its first token
    meanwhile, gives (the context lengths of every request running then, gap).
At most `MAX_SAMPLES` of each are kept (a seeded draw), so the frame stays small.
A `probe` frame with `cancel` stops the replay of its `probe_id` (its streams are closed, so the
engine aborts their requests): a cancelled profile job leaves no load behind on the engine.
Percentiles count a request that produced no token as infinitely late (reported as null); with no
inter-token gap at all (one-token outputs) the TBT percentiles are 0, as in the simulator probe.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import math
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gpu_agent.engines.metrics import parse_metrics
from gpu_agent.protocol import DeploymentSpec, IterationSample, Probe, ProbeReport, ProbeRequestSpec
from serving.profiler.sim_probe import tail_percentile

DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2}
CACHE_INFO = "vllm:cache_config_info"
MAX_SAMPLES = 300

# The replays running in this process (the agent's event loop), by probe id: set to stop one.
_REPLAYS: dict[str, asyncio.Event] = {}


def model_config(source: str) -> dict[str, Any]:
    """The model's config.json when `source` is a local directory, else {}."""
    path = os.path.join(source, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def kv_bytes_per_token(config: dict[str, Any], dtype: str) -> int:
    """2 x layers x KV heads x head dim x dtype bytes; 0 when the config lacks the figures."""
    try:
        layers = int(config["num_hidden_layers"])
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return 0
    name = dtype if dtype != "auto" else str(config.get("torch_dtype") or config.get("dtype") or "float16")
    return 2 * layers * kv_heads * head_dim * DTYPE_BYTES.get(name, 2)


def cache_blocks(metrics_text: str) -> int:
    """num_gpu_blocks x block_size from ``vllm:cache_config_info`` (tokens of KV); 0 if absent."""
    for family in text_string_to_metric_families(metrics_text):
        if family.name != CACHE_INFO:
            continue
        for sample in family.samples:
            try:
                return int(sample.labels["num_gpu_blocks"]) * int(sample.labels["block_size"])
            except (KeyError, ValueError):
                continue
    return 0


@dataclass
class _Track:
    """One replayed request: when it was sent and when each chunk arrived (monotonic seconds)."""

    spec: ProbeRequestSpec
    sent_at: float | None = None
    chunks: list[float] = field(default_factory=list)
    finished: bool = False
    closed: bool = False  # its stream has ended (finished, failed or cancelled)
    lost: str = ""  # the connection failed (refused, reset, cut): the engine went away, not late
    held: int = 0  # tokens of KV it is known to hold now (counted in _KvPeaks.held)


@dataclass
class _KvPeaks:
    """The highest KV use and demand seen during one replay, as fractions of the capacity."""

    capacity_tokens: int
    used: float = 0.0
    demand: float = 0.0
    held: int = 0  # sum of the tracks' `held`, kept as chunks arrive and streams end

    def scraped(self, usage: float, tracks: list[_Track]) -> None:
        """One /metrics scrape: `usage` is the engine's gauge; demand adds the unanswered prompts."""
        waiting = sum(t.spec.prompt_tokens for t in tracks if t.sent_at is not None and not t.chunks)
        self.used = max(self.used, usage)
        self.demand = max(self.demand, usage + self._fraction(waiting))

    def streamed(self, track: _Track) -> None:
        """`track` got a chunk or ended: a request between its first and last chunk holds at least
        its prompt and the tokens streamed so far; the sum over requests is a lower bound of use."""
        streaming = track.chunks and not (track.finished or track.closed)
        now = track.spec.prompt_tokens + len(track.chunks) - 1 if streaming else 0
        self.held += now - track.held
        track.held = now
        self.used = max(self.used, self._fraction(self.held))
        self.demand = max(self.demand, self.used)

    def _fraction(self, tokens: int) -> float:
        return min(1.0, tokens / self.capacity_tokens) if self.capacity_tokens else 0.0


def _or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _end(track: _Track) -> float:
    return track.chunks[-1] if track.chunks else math.inf


def draw_prompts(tracks: list[_Track], rng: random.Random, low: int, high: int) -> list[list[int]]:
    """Each request's prompt: `prompt_tokens` token ids drawn from [low, high), in order."""
    return [[rng.randrange(low, high) for _ in range(t.spec.prompt_tokens)] for t in tracks]


def prefill_samples(tracks: list[_Track], rng: random.Random) -> list[IterationSample]:
    """((prompt,), TTFT) of each request that had the engine to itself until its first token."""
    out = []
    for t in tracks:
        if t.sent_at is None or not t.chunks:
            continue
        start, first = t.sent_at, t.chunks[0]
        alone = not any(
            u is not t and u.sent_at is not None and u.sent_at < first and _end(u) > start for u in tracks
        )
        if alone and first > start:
            out.append(IterationSample([t.spec.prompt_tokens], first - start))
    return rng.sample(out, MAX_SAMPLES) if len(out) > MAX_SAMPLES else out


def decode_samples(tracks: list[_Track], rng: random.Random) -> list[IterationSample]:
    """(contexts of the running requests, gap) for inter-chunk gaps during which no request waited
    for its first token (a pure decode step); a seeded draw of candidate gaps keeps this cheap."""
    gaps = [(i, k) for i, t in enumerate(tracks) for k in range(len(t.chunks) - 1)]
    rng.shuffle(gaps)
    out = []
    for i, k in gaps[: 20 * MAX_SAMPLES]:
        a, b = tracks[i].chunks[k], tracks[i].chunks[k + 1]
        live = [u for u in tracks if u.sent_at is not None and u.sent_at < b and _end(u) >= b]
        if b <= a or any(not u.chunks or u.chunks[0] > a for u in live):
            continue  # someone was being prefilled (or queued) during this step
        contexts = [u.spec.prompt_tokens + bisect.bisect_right(u.chunks, a) for u in live]
        out.append(IterationSample(contexts, b - a))
        if len(out) == MAX_SAMPLES:
            break
    return out


class ProbeRunner:
    """Replays one `probe` frame against one engine (module docstring)."""

    def __init__(
        self, base_url: str, spec: DeploymentSpec, *, sample_interval_s: float = 0.2, vocab_floor: int = 10
    ) -> None:
        """
        Args:
            base_url: The engine's ``http://host:port``.
            spec: The deployment (its served model name, source and dtype).
            sample_interval_s: Seconds between /metrics scrapes while replaying.
            vocab_floor: Prompt token ids are drawn from [vocab_floor, vocab size) (skips the
                special tokens most vocabularies put first).
        """
        self.base_url = base_url
        self.spec = spec
        self.sample_interval_s = sample_interval_s
        config = model_config(spec.model.source)
        self.kv_bytes_per_token = kv_bytes_per_token(config, spec.model.dtype)
        self.vocab = int(config.get("vocab_size") or 1000)
        self.vocab_floor = min(vocab_floor, self.vocab - 1)

    async def run(self, frame: Probe) -> ProbeReport:
        """Replay `frame.requests`; never raises for engine errors: an error answer (HTTP 500) is an
        unfinished request, a lost connection (the engine stopped or restarted) fails the probe.
        A `cancel` frame stops the replay of its probe id instead; the stopped replay then answers
        with a report that is not ok."""
        if frame.cancel:
            stop = _REPLAYS.get(frame.probe_id)
            if stop is None:
                return failed(frame, "cancelled: no replay of this probe was running")
            stop.set()
            return failed(frame, "cancelled: the replay was stopped")
        stop = _REPLAYS[frame.probe_id] = asyncio.Event()
        try:
            return await self._replay(frame, stop)
        finally:
            if _REPLAYS.get(frame.probe_id) is stop:
                del _REPLAYS[frame.probe_id]

    async def _replay(self, frame: Probe, stop: asyncio.Event) -> ProbeReport:
        tracks = [_Track(r) for r in sorted(frame.requests, key=lambda r: r.arrival_s)]
        # In a worker thread, as the samples at the end: both take seconds for a few thousand
        # requests, which on the agent's loop would hold up its heartbeats (the host goes stale).
        rng = random.Random(frame.seed)
        prompts = await asyncio.to_thread(draw_prompts, tracks, rng, self.vocab_floor, self.vocab)
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        timeout = httpx.Timeout(frame.timeout_s, connect=10.0)
        # The engine's key (DeploymentSpec.api_key): /v1/completions refuses requests without it.
        headers = {"authorization": f"Bearer {self.spec.api_key}"} if self.spec.api_key else {}
        async with httpx.AsyncClient(  # to this host's engine: never through the env's proxy
            base_url=self.base_url, limits=limits, timeout=timeout, headers=headers, trust_env=False
        ) as http:
            capacity_tokens = await self._capacity_tokens(http)
            capacity = capacity_tokens * self.kv_bytes_per_token
            peaks = _KvPeaks(capacity_tokens)
            start = time.monotonic()
            sampler = asyncio.create_task(self._sample(http, tracks, peaks))
            sends = [
                asyncio.create_task(self._send(http, t, p, start, peaks))
                for t, p in zip(tracks, prompts, strict=True)
            ]
            replay: asyncio.Future[Any] = asyncio.gather(*sends)
            stopped: asyncio.Future[Any] = asyncio.create_task(stop.wait())
            try:
                # On timeout, whatever is still running counts as unfinished.
                await asyncio.wait(
                    {replay, stopped}, timeout=frame.timeout_s, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                for task in [*sends, sampler, stopped]:
                    task.cancel()  # closes their streams: the engine aborts those requests
                await asyncio.gather(replay, *sends, sampler, stopped, return_exceptions=True)
            duration = time.monotonic() - start
        if stop.is_set():
            sent = sum(t.sent_at is not None for t in tracks)
            return failed(frame, f"cancelled after {duration:.1f} s ({sent} of {len(tracks)} requests sent)")
        lost = [t.lost for t in tracks if t.lost]
        if lost:
            # The engine stopped or restarted mid-probe: its answers say nothing about the rate
            # (counted as late, they would pull the profile's max rate down), so the probe fails.
            return failed(
                frame,
                f"the engine was unreachable during the probe: {len(lost)} of {len(tracks)} requests "
                f"lost their connection (first: {lost[0]})",
            )
        # (Every task touching the tracks has ended: the thread has them to itself.)
        return await asyncio.to_thread(self._report, frame, tracks, capacity, peaks, duration)

    async def _capacity_tokens(self, http: httpx.AsyncClient) -> int:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            resp = await http.get("/metrics")
            resp.raise_for_status()
            return cache_blocks(resp.text)
        return 0

    async def _sample(self, http: httpx.AsyncClient, tracks: list[_Track], peaks: _KvPeaks) -> None:
        while True:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                resp = await http.get("/metrics")
                resp.raise_for_status()
                peaks.scraped(parse_metrics(resp.text).kv_cache_usage or 0.0, tracks)
            await asyncio.sleep(self.sample_interval_s)

    async def _send(
        self,
        http: httpx.AsyncClient,
        track: _Track,
        prompt: list[int],
        start: float,
        peaks: _KvPeaks,
    ) -> None:
        delay = start + track.spec.arrival_s - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        body = {
            "model": self.spec.model.name,
            "prompt": prompt,
            "max_tokens": track.spec.max_tokens,
            "min_tokens": track.spec.max_tokens,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": True,
        }
        track.sent_at = time.monotonic()
        try:
            async with http.stream("POST", "/v1/completions", json=body) as resp:
                if resp.status_code != 200:
                    return
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    choices = json.loads(data).get("choices") or []
                    if not choices:
                        continue
                    track.chunks.append(time.monotonic())
                    if choices[0].get("finish_reason"):
                        track.finished = True
                    peaks.streamed(track)
        except httpx.TimeoutException:
            return  # slow, not gone: unfinished (the probe's deadline counts it late)
        except httpx.TransportError as exc:  # refused, reset, cut mid-stream
            track.lost = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        except (httpx.HTTPError, ValueError):
            return
        finally:
            track.closed = True
            peaks.streamed(track)

    def _report(
        self, frame: Probe, tracks: list[_Track], capacity: int, peaks: _KvPeaks, duration: float
    ) -> ProbeReport:
        firsts = [t.chunks[0] - t.sent_at for t in tracks if t.chunks and t.sent_at is not None]
        gaps = [b - a for t in tracks for a, b in zip(t.chunks, t.chunks[1:], strict=False)]
        missing = len(tracks) - len(firsts)
        return ProbeReport(
            probe_id=frame.probe_id,
            deployment_id=frame.deployment_id,
            ok=True,
            rate=frame.rate,
            num_requests=len(tracks),
            finished=sum(t.finished for t in tracks),
            ttft_p99_s=_or_none(tail_percentile(firsts, missing, 99.0)),
            tbt_p99_s=_or_none(tail_percentile(gaps, 0, 99.0)) if gaps else 0.0,
            ttft_p50_s=_or_none(tail_percentile(firsts, missing, 50.0)),
            tbt_p50_s=_or_none(tail_percentile(gaps, 0, 50.0)) if gaps else 0.0,
            kv_capacity_bytes=capacity,
            peak_kv_used_bytes=int(peaks.used * capacity),
            peak_kv_demand_bytes=int(peaks.demand * capacity),
            kv_bytes_per_token=self.kv_bytes_per_token,
            duration_s=duration,
            prefill_samples=prefill_samples(tracks, random.Random(frame.seed)),
            decode_samples=decode_samples(tracks, random.Random(frame.seed + 1)),
        )


def probe_summary(report: ProbeReport) -> str:
    """One log line of what a probe saw, for the agent's operator (the control plane gets it all)."""
    if not report.ok:
        return f"Probe of deployment {report.deployment_id} failed: {report.error}"

    def ms(seconds: float | None, none: str) -> str:
        return none if seconds is None else f"{1e3 * seconds:.0f} ms"

    # A null TTFT percentile: too many requests gave no token; a null TBT one: no gap was seen.
    return (
        f"Probe of deployment {report.deployment_id} at {report.rate:.4g} req/s: {report.finished} of "
        f"{report.num_requests} requests finished in {report.duration_s:.0f} s; TTFT p50/p99 "
        f"{ms(report.ttft_p50_s, 'late')}/{ms(report.ttft_p99_s, 'late')}, TBT p50/p99 "
        f"{ms(report.tbt_p50_s, 'n/a')}/{ms(report.tbt_p99_s, 'n/a')}."
    )


def failed(frame: Probe, error: str) -> ProbeReport:
    """The answer to a probe that could not run (unknown deployment, engine not running...)."""
    return ProbeReport(probe_id=frame.probe_id, deployment_id=frame.deployment_id, ok=False, error=error)
