"""Registry of dataset length distributions fitted to published summary statistics.

Each entry is a pair of independent lognormals (see `lengths.py`). The MEAN of every distribution is
taken from a published figure, cited below; where the source gives no second statistic, the spread
(coefficient of variation, cv) is an assumption of this module, marked "assumed". Means are of the
unclamped lognormal; clamping to `max_context` lowers the realised mean for long-tailed sets.

sharegpt   vLLM (Kwon et al., SOSP'23), Fig. 11a: ShareGPT prompt mean 161.31 tokens, output mean
           337.99 tokens (the paper notes 8.4x longer prompts and 5.8x longer outputs than Alpaca).
           cv 1.5 (prompt) / 1.0 (output) assumed: long-tailed chat turns.
alpaca     vLLM (Kwon et al., SOSP'23), Fig. 11b: Alpaca prompt mean 19.31, output mean 58.45 tokens.
           cv 0.6 / 0.9 assumed: short single-turn instructions.
bookcorpus A BookCorpus-style long-document summarisation set, fitted to BookSum (Kryscinski et al.,
           2021, Table 1, chapter level): source mean ~5,102 tokens, summary mean ~505 tokens.
           cv 0.8 / 0.6 assumed.
longbench  LongBench (Bai et al., ACL'24), abstract / Table 1: average English input 6,711 words,
           taken as ~8,700 tokens at 1.3 tokens per word (assumed Llama-tokenizer ratio); outputs
           follow the summarisation tasks' generation cap of 512 tokens (THUDM/LongBench
           config/dataset2maxlen.json: gov_report, qmsum, vcsum = 512) with mean 300 assumed,
           clamped at 512. cv 0.6 / 0.5 assumed.
humaneval  HumanEval (Chen et al., 2021): 164 hand-written Python problems; a prompt is a signature
           plus docstring with examples (~400-600 characters) and the canonical body is a few lines.
           Means of 150 prompt tokens and 100 output tokens are ESTIMATES from the released
           problems at ~4 characters per token (no published token statistics were found); DistServe
           (OSDI'24, Sec. 6.1) uses HumanEval for its code-completion workload. cv 0.4 / 0.6 assumed.
"""

from __future__ import annotations

from serving.workload.lengths import LengthDistribution, LogNormalLength

# name -> distribution
_REGISTRY: dict[str, LengthDistribution] = {}


def register_length_dist(dist: LengthDistribution) -> None:
    """Add a distribution under `dist.name`.

    Raises:
        ValueError: The name is already registered.
    """
    if dist.name in _REGISTRY:
        raise ValueError(f"length distribution {dist.name!r} is already registered")
    _REGISTRY[dist.name] = dist


def get_length_dist(name: str) -> LengthDistribution:
    """The registered distribution called `name`.

    Raises:
        ValueError: Unknown name; the message lists the registered ones.
    """
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown dataset {name!r}; choose one of: {', '.join(available_length_dists())}"
        ) from None


def available_length_dists() -> list[str]:
    """Registered dataset names, sorted."""
    return sorted(_REGISTRY)


def _ln(mean: float, cv: float, max_tokens: int = 1 << 20) -> LogNormalLength:
    return LogNormalLength.from_mean_cv(mean, cv, max_tokens=max_tokens)


for _dist in (
    LengthDistribution("sharegpt", _ln(161.31, 1.5), _ln(337.99, 1.0), 8192, "vLLM SOSP'23 Fig. 11a (means)"),
    LengthDistribution("alpaca", _ln(19.31, 0.6), _ln(58.45, 0.9), 8192, "vLLM SOSP'23 Fig. 11b (means)"),
    LengthDistribution(
        "bookcorpus", _ln(5102.0, 0.8), _ln(505.0, 0.6), 16384, "BookSum 2021 Table 1, chapter level (means)"
    ),
    LengthDistribution(
        "longbench",
        _ln(8700.0, 0.6),
        _ln(300.0, 0.5, max_tokens=512),
        32768,
        "LongBench ACL'24 (6,711 words avg) + dataset2maxlen 512",
    ),
    LengthDistribution(
        "humaneval", _ln(150.0, 0.4), _ln(100.0, 0.6), 8192, "HumanEval 2021 (estimated from problems)"
    ),
):
    register_length_dist(_dist)
