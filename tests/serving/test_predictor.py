"""The response-length predictor: corpus structure, determinism, and error against the mean."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from serving.predictor import LengthPredictor, bucket_of, make_corpus, prompt_workload, train_predictor
from serving.predictor.workload import arrival_seed
from serving.workload.arrivals import poisson_arrivals


@pytest.fixture(scope="module")
def predictor() -> LengthPredictor:
    return train_predictor(n=2000, seed=101)


def test_it_beats_predicting_the_mean_on_held_out_prompts(predictor: LengthPredictor) -> None:
    held_out = make_corpus(600, seed=202)
    report = predictor.evaluate([s.text for s in held_out], [s.output_tokens for s in held_out])
    assert report.samples == 600
    assert report.mae < 0.7 * report.mean_baseline_mae
    # More than a third of predictions land in the right bucket (six buckets), most within one.
    assert report.bucket_accuracy > 0.4 and report.within_one_bucket > 0.8


def test_it_is_deterministic_per_seed() -> None:
    a, b, c = make_corpus(300, seed=5), make_corpus(300, seed=5), make_corpus(300, seed=6)
    assert a == b and a != c
    texts = [s.text for s in make_corpus(100, seed=9)]
    p1 = train_predictor(n=500, seed=3).predict(texts)
    p2 = train_predictor(n=500, seed=3).predict(texts)
    assert np.array_equal(p1, p2)


def test_it_counts_prompt_words_and_follows_explicit_length_requests() -> None:
    corpus = make_corpus(1500, seed=4)
    assert all(s.prompt_tokens == len(s.text.split()) and s.output_tokens >= 1 for s in corpus)
    write = [s for s in corpus if s.category == "write"]
    asked = np.array([int(next(w for w in s.text.split() if w.isdigit())) for s in write])
    got = np.array([s.output_tokens for s in write])
    assert np.corrcoef(asked, got)[0, 1] > 0.9
    translate = [s for s in corpus if s.category == "translate"]
    ratio = np.median([s.output_tokens / s.prompt_tokens for s in translate])
    assert 0.9 < ratio < 1.3


def test_it_predicts_longer_answers_for_longer_requested_essays(predictor: LengthPredictor) -> None:
    short, long = predictor.predict(
        ["Write an essay of about 100 words about travel", "Write an essay of about 900 words about travel"]
    )
    assert long > 4 * short


def test_buckets_are_half_open_ranges() -> None:
    edges = (0, 64, 128)
    assert [bucket_of(v, edges) for v in (0, 1, 63, 64, 127, 128, 10_000)] == [0, 0, 0, 1, 1, 2, 2]


def test_prompt_workloads_share_prompts_across_rates() -> None:
    slow, fast = prompt_workload(2.0, 60.0, seed=8), prompt_workload(6.0, 60.0, seed=8)
    n = min(len(slow.requests), len(fast.requests))
    assert len(fast.requests) > len(slow.requests) > 50
    assert [s.text for s in slow.samples[:n]] == [s.text for s in fast.samples[:n]]
    assert [r.output_tokens for r in slow.requests[:n]] == [r.output_tokens for r in fast.requests[:n]]
    assert [r.req_id for r in fast.requests] == list(range(len(fast.requests)))


@pytest.mark.parametrize("seed", [0, 8, 2**40])
def test_no_request_content_is_drawn_from_the_arrivals_stream(seed: int) -> None:
    # The arrivals drew from default_rng([seed, 1]), which make_corpus gives prompt 1: request 1's
    # category, words and lengths were set by the same draws as the arrival gaps.
    wl = prompt_workload(2.0, 60.0, seed=seed)
    times = np.array([r.arrival for r in wl.requests])
    assert len(times) > 50
    for i in range(len(times)):  # [seed, i] seeds the corpus's prompt i
        assert not np.array_equal(times, poisson_arrivals(2.0, 60.0, np.random.default_rng([seed, i])))
    again = poisson_arrivals(2.0, 60.0, np.random.default_rng(arrival_seed(seed)))
    assert np.array_equal(times, again)  # seeded, and the same whatever corpus is given
    other = make_corpus(len(times), seed=seed + 1)
    assert [r.arrival for r in prompt_workload(2.0, 60.0, seed=seed, corpus=other).requests] == times.tolist()


def test_it_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="alpha"):
        LengthPredictor(alpha=0)
    with pytest.raises(ValueError, match="bucket_edges"):
        LengthPredictor(bucket_edges=(0, 64, 32))
    with pytest.raises(RuntimeError, match="fit"):
        LengthPredictor().predict(["hello"])


@pytest.mark.parametrize("alpha", [np.inf, np.nan, -1.0])
def test_it_rejects_a_non_finite_or_negative_alpha(alpha: float) -> None:
    # alpha=inf used to fit NaN weights and predict -2**63 tokens for every prompt.
    with pytest.raises(ValueError, match="alpha"):
        LengthPredictor(alpha=alpha)


@pytest.mark.parametrize("alpha", [1e-300, 5e-324])
def test_a_tiny_alpha_fits_the_unregularised_limit_instead_of_raising(alpha: float) -> None:
    # np.linalg.solve(X'X + alpha I', ...) raised LinAlgError ("Singular matrix") once alpha was
    # below rounding and hashed columns coincide (50 prompts, 516 features): alpha is accepted by
    # the constructor as positive and finite, so fit must work for it.
    corpus = make_corpus(50, seed=1)
    texts, lengths = [s.text for s in corpus], [s.output_tokens for s in corpus]
    tiny = LengthPredictor(alpha=alpha).fit(texts, lengths)
    assert tiny.weights is not None and np.all(np.isfinite(tiny.weights))
    small = LengthPredictor(alpha=1e-9).fit(texts, lengths)
    assert np.array_equal(tiny.predict(texts), small.predict(texts))  # ridge's alpha -> 0 limit
    # The intercept stays out of the penalty however large alpha is: the geometric mean remains.
    flat = LengthPredictor(alpha=1e300).fit(texts, lengths).predict(texts)
    assert np.all(flat == round(np.expm1(np.log1p(lengths).mean())))


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_it_refuses_to_fit_non_finite_output_lengths(bad: float) -> None:
    # A NaN or inf length used to pass the ">= 1" check and give NaN weights (garbage predictions).
    lengths: list[Any] = [bad, 9]  # as read from a CSV column with a missing value
    with pytest.raises(ValueError, match="output lengths"):
        LengthPredictor().fit(["write a poem", "hi"], lengths)


@pytest.mark.parametrize(
    ("texts", "lengths"),
    [([], []), (["a b", "c"], [1, 2, 3])],
    ids=["empty", "mismatched"],
)
def test_evaluate_rejects_what_fit_rejects(texts: list[str], lengths: list[int]) -> None:
    # Empty used to give a report of NaNs; mismatched, numpy's "operands could not be broadcast".
    fitted = LengthPredictor().fit(["write a poem", "hi"], [200, 5])
    with pytest.raises(ValueError, match="as many output lengths as prompts"):
        fitted.evaluate(texts, lengths)


@pytest.mark.parametrize(
    "text",
    [
        "Write an essay of about ² words",  # "²".isdigit() but int("²") raised ValueError
        "Write an essay of about " + "9" * 400 + " words",  # log1p(int) raised OverflowError
        "Write an essay of about " + "9" * 5000 + " words",  # int() refuses over 4,300 digits
        "",
        "日本語で短い詩を書いてください 🙂",
    ],
    ids=["superscript", "400-digit", "5000-digit", "empty", "non-ascii"],
)
def test_it_predicts_an_in_range_length_for_any_prompt(predictor: LengthPredictor, text: str) -> None:
    [length] = predictor.predict([text]).tolist()
    assert 1 <= length <= predictor.max_prediction
    assert 0 <= predictor.predict_buckets([text])[0] < len(predictor.bucket_edges)


def test_a_huge_length_request_predicts_the_longest_bucket(predictor: LengthPredictor) -> None:
    # A 50-digit request extrapolated to exp(~100) tokens, which wrapped to -2**63 as int64: a length
    # of less than 1 token, in bucket 0 (the shortest). Now it is capped, and in the last bucket.
    asks = [f"Write an essay of about {n} words about travel" for n in ("900", "9" * 20, "9" * 50)]
    lengths = predictor.predict(asks).tolist()
    assert lengths == sorted(lengths) and lengths[-1] == predictor.max_prediction
    assert predictor.predict_buckets(asks)[1:] == [len(predictor.bucket_edges) - 1] * 2


def test_numbers_in_other_scripts_read_as_numbers() -> None:
    from serving.predictor.features import featurize

    arabic, ascii_ = featurize(["write about ٤٠٠ words", "write about 400 words"])[:, 2:4]
    assert arabic.tolist() == ascii_.tolist() and ascii_[1] == 1.0


def test_a_prompt_with_a_lone_surrogate_is_featurized_like_any_other(predictor: LengthPredictor) -> None:
    # json.loads('"\\ud83d"') gives a lone surrogate (half an emoji cut by a client); hashing the
    # word with a strict UTF-8 encode raised UnicodeEncodeError out of predict().
    import json

    from serving.predictor.features import featurize

    text = json.loads('"Write a poem \\ud83d about the sea"')
    [length] = predictor.predict([text]).tolist()
    assert 1 <= length <= predictor.max_prediction
    # The surrogate is a word of the prompt like any other (counted and hashed).
    assert featurize([text])[0, 1] == featurize(["Write a poem x about the sea"])[0, 1]


def test_leading_zeros_of_any_script_do_not_make_a_number_huge() -> None:
    # Only ASCII "0"s were stripped before the length check, so 400 written with 14 leading
    # Arabic-Indic zeros read as NUMBER_CAP (10**12), an ASCII-padded 400 as 400.
    from serving.predictor.features import featurize

    padded = featurize(
        ["write about " + "\u0660" * 14 + "\u0664\u0660\u0660 words", "write about " + "0" * 14 + "400 words"]
    )
    assert (
        padded[0, 2:4].tolist()
        == padded[1, 2:4].tolist()
        == featurize(["write about 400 words"])[0, 2:4].tolist()
    )
