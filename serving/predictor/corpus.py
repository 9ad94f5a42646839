"""A seeded, synthetic-but-structured prompt corpus with category-dependent response lengths.

No dataset can be downloaded here, so prompts are generated from templates. What makes response
length predictable in real chat logs is kept: the task category (visible in the prompt's wording),
the prompt's length (a translation is as long as its source, a summary a fraction of it) and explicit
length requests ("in about 400 words"). Lengths are in whitespace tokens: a prompt's
`prompt_tokens` is the number of words of its text.

Category     prompt length                      response length
chat         sharegpt prompt distribution       sharegpt output distribution (mean 338, cv 1.0)
qa           alpaca prompt distribution         alpaca output distribution (mean 58)
code         humaneval prompt distribution      humaneval output distribution (mean 100)
summarise    sharegpt prompt x 4 (long docs)    ~0.1 x the document (BookSum's summary/source ratio
                                                505 / 5,102, see serving/workload/datasets.py)
translate    sharegpt prompt distribution       ~1.15 x the source text
write        short instruction with a length    ~1.3 tokens per requested word
             request of 100..1000 words

The category mix (chat 40%, write 15%, qa 15%, code 10%, summarise 10%, translate 10%) gives mean
prompt / response lengths of roughly 160 / 300 tokens, close to ShareGPT's 161 / 338.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from serving.workload.datasets import get_length_dist

CATEGORIES: tuple[str, ...] = ("chat", "qa", "code", "summarise", "translate", "write")
# category -> share of the corpus
MIX: dict[str, float] = {
    "chat": 0.4,
    "qa": 0.15,
    "code": 0.1,
    "summarise": 0.1,
    "translate": 0.1,
    "write": 0.15,
}
# category -> the serving/workload dataset its prompt (and, where not derived, response) lengths follow
_DATASET = {"chat": "sharegpt", "qa": "alpaca", "code": "humaneval"}

_OPENERS: dict[str, tuple[str, ...]] = {
    "chat": ("Can you help me with", "I have a question about", "What do you think about", "Tell me about"),
    "qa": ("What is", "Who was", "When did", "Name the", "Which is the"),
    "code": ("Write a Python function that", "Implement a function to", "Complete the code:", "def solve():"),
    "summarise": ("Summarize the following text:", "Give a short summary of this article:", "TL;DR:"),
    "translate": ("Translate into French:", "Translate this to German:", "Please translate to Spanish:"),
    "write": ("Write an essay", "Write a story", "Write a blog post", "Write a cover letter"),
}
_WORDS: dict[str, tuple[str, ...]] = {
    "chat": ("my", "project", "idea", "feel", "friend", "work", "life", "plan", "advice", "really"),
    "qa": ("capital", "largest", "year", "river", "author", "element", "planet", "country"),
    "code": ("list", "return", "int", "string", "array", "sorted", "index", "value", "loop", "test"),
    "summarise": ("the", "report", "study", "market", "results", "growth", "company", "data", "said"),
    "translate": ("the", "weather", "house", "morning", "train", "friends", "dinner", "city", "today"),
    "write": ("about", "nature", "history", "technology", "travel", "job", "future", "ocean"),
}


@dataclass(frozen=True, slots=True)
class PromptSample:
    """One prompt and the length of its response.

    Attributes:
        text: The prompt.
        category: Its task category (one of CATEGORIES); known to the generator, not the predictor.
        prompt_tokens: Words in `text`.
        output_tokens: Tokens of the response, >= 1.
    """

    text: str
    category: str
    prompt_tokens: int
    output_tokens: int


def _lognormal_factor(rng: np.random.Generator, cv: float) -> float:
    s2 = np.log1p(cv * cv)
    return float(np.exp(rng.normal(-s2 / 2, np.sqrt(s2))))


def _body(rng: np.random.Generator, category: str, n: int) -> list[str]:
    words = _WORDS[category]
    return [words[i] for i in rng.integers(0, len(words), size=max(n, 0))]


def _sample_one(rng: np.random.Generator, category: str, max_context: int) -> PromptSample:
    opener = _OPENERS[category][int(rng.integers(len(_OPENERS[category])))]
    head = opener.split()
    if category == "write":
        words = int(rng.integers(1, 11)) * 100
        head = [*head, "of", "about", str(words), "words", "about"]
        body = _body(rng, category, int(rng.integers(2, 12)))
        output = words * 1.3 * _lognormal_factor(rng, 0.2)
    else:
        dist = get_length_dist(_DATASET.get(category, "sharegpt"))
        z = rng.standard_normal(2)
        n_prompt = int(dist.prompt.from_normal(z[:1])[0])
        if category == "summarise":
            n_prompt *= 4
        body = _body(rng, category, n_prompt - len(head))
        if category == "summarise":
            output = 0.1 * len(body) * _lognormal_factor(rng, 0.3)
        elif category == "translate":
            output = 1.15 * len(body) * _lognormal_factor(rng, 0.15)
        else:
            output = float(dist.output.from_normal(z[1:])[0])
    words_all = head + body
    output_tokens = max(1, round(output))
    # Keep prompt + response inside the context window: truncate the prompt, then the response.
    output_tokens = min(output_tokens, max_context // 2)
    words_all = words_all[: max(1, max_context - output_tokens)]
    return PromptSample(" ".join(words_all), category, len(words_all), output_tokens)


def make_corpus(n: int, seed: int = 0, max_context: int = 4096) -> list[PromptSample]:
    """`n` prompts with their response lengths, deterministic for a seed (and prefix-stable in n).

    Args:
        n: Number of samples.
        seed: Seed of every random choice.
        max_context: Cap on prompt + response tokens.
    """
    if n < 0:
        raise ValueError(f"{n=} must be >= 0")
    if max_context < 4:
        raise ValueError(f"{max_context=} must be >= 4")
    names = list(MIX)
    cum = np.cumsum([MIX[c] for c in names])
    out = []
    for i in range(n):
        # One generator per sample: the first k samples are the same whatever n is.
        rng = np.random.default_rng([seed, i])
        k = min(int(np.searchsorted(cum, rng.random() * cum[-1], side="right")), len(names) - 1)
        out.append(_sample_one(rng, names[k], max_context))
    return out
