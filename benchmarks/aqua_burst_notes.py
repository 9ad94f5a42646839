"""Setup notes of benchmarks/aqua_burst.py: each change to its setup, with the measurements behind
it (also written into its JSON under `setup_notes`)."""

SETUP_NOTES = [
    "The burst arrives when a long request has streamed half its output tokens (was: after a "
    "fixed 2 s, which made the default scheduler's burst p99 TTFT swing between 0.49 s and 1.5 s "
    "with the machine's speed).",
    "All engines run with VLLM_CPU_NUM_OF_RESERVED_CPU=1, vLLM's own reservation without a KV "
    "connector; with a connector vLLM 0.32 reserves one more core, which on this 2-core machine "
    "left none for the engine core and made steps 5-7x slower (serving/vllm_ext/cpu_binding.py).",
    "Every engine runs one unmeasured round of the workload first (`warmup_round` in the JSON). An "
    "engine's first burst runs batch shapes it has not run before: ours' burst p99 was 43-52 ms in "
    "the first round against 18-47 ms later (fast machine, TBT 1.7 ms) and 83 ms against 48-69 ms "
    "(slow machine, TBT 7-10 ms); its first burst step took 27 ms instead of 5, and the Aqua "
    "scheduler without the connector showed the same. A serving engine pays this once per start.",
    "Every measured workload starts 1.5 s after the previous engine's last request "
    "(SWITCH_PAUSE_S), and the engines' order rotates each round. vLLM's shared-memory queues spin "
    "for 1 s after their last message, in the worker and in the engine core, so the engine measured "
    "next shared the 2 cores with two spinning processes. Default and ours alternating, 4 rounds per "
    "setting, in order: no pause, pause, no pause, pause (TBT 1.5 ms): median makespans 0.560/0.594, "
    "0.546/0.571, 0.579/0.601 and 0.525/0.573 s (default/ours); ours' burst p99 20.6, 14.5, 14.8 and "
    "14.7 ms. The idle burst still follows its own engine's workload at once: with the pause before "
    "it too, it met parked queues (medians of ours' idle-burst p99 17.9 and 20.6 ms in two full runs, "
    "against 14.3 and 13.1 ms in two without; the machine's TBT also varied, 1.5-1.8 ms).",
    "A full run measures 15 rounds (was 5). In the last 5-round run (TBT 2.3 ms) the paired rounds' "
    "throughput ratios (ours/default) were 0.81, 1.25, 0.87, 0.95 and 1.11: each workload lasts under "
    "a second on 2 shared cores, so one round's ratio is mostly noise, and the best-of-5 headline "
    "(1.046) and the median (0.952) could not tell a 5% difference. The configs and the headline's "
    "definition are unchanged.",
    "The long requests generate 480 tokens (was 320; --long-tokens), so the burst meets 240 remaining "
    "decode steps instead of 160. The default's burst p99 TTFT grows with that remainder, ours' does "
    "not: same code and machine, one run after the other (2026-12-07), p99_ttft_ratio 34.3 at 480 "
    "tokens (paired-round median 34.2) and 24.8 at 320 (median 20.8); throughput_ratio 0.961 and 0.947.",
]
