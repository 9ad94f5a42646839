"""Prompt features for the response-length predictor.

A prompt becomes a fixed-width vector:
  [0]            1 (intercept)
  [1]            log(1 + prompt words)
  [2]            log(1 + the first number in the prompt), 0 if none (explicit length requests:
                 "in about 400 words"); a number is a word of decimal digits (any script: "400",
                 "٤٠٠"; not "²", which int() refuses), read up to NUMBER_CAP (a 5,000-digit word
                 would not fit a float, nor Python's int-from-string limit)
  [3]            1 if the prompt contains a number, else 0
  [4 : 4 + D]    hashed bag of words: word w adds 1 / sqrt(words) to column crc32(w) mod D, and so
                 does each of the first 4 words again in a second hashed "opener" space (the
                 instruction's wording says most about the task)
  [4 + D : ]     the same opener space, D columns
Hashing uses zlib.crc32 of a word's UTF-8 (lone surrogates passed through), stable across processes
(Python's str hash is salted per process).
"""

from __future__ import annotations

import math
import unicodedata
import zlib
from collections.abc import Sequence

import numpy as np

DEFAULT_HASH_DIM = 256
_DENSE = 4
_OPENER_WORDS = 4
# Numbers beyond this read as it: no length request is anywhere near, and log1p needs a float.
NUMBER_CAP = 10**12


def num_features(hash_dim: int = DEFAULT_HASH_DIM) -> int:
    """Width of the feature vector for a hash space of `hash_dim` columns."""
    return _DENSE + 2 * hash_dim


def _strip_zeros(word: str) -> str:
    i = 0
    while i < len(word) and unicodedata.decimal(word[i]) == 0:
        i += 1
    return word[i:]


def _first_number(words: Sequence[str]) -> int | None:
    for w in words:
        # isdecimal, not isdigit: superscripts and circled digits ("²", "①") are digits that int()
        # refuses. Only the leading digits past the cap's length are parsed.
        if w.isdecimal():
            # Leading zeros of any script (ASCII, Arabic-Indic, Devanagari ...) are not significant.
            digits = w.lstrip("0") if w.isascii() else _strip_zeros(w)
            digits = digits or "0"
            return NUMBER_CAP if len(digits) > len(str(NUMBER_CAP)) else min(int(digits), NUMBER_CAP)
    return None


def featurize(texts: Sequence[str], hash_dim: int = DEFAULT_HASH_DIM) -> np.ndarray:
    """Feature matrix (len(texts) x num_features(hash_dim)) of the prompts, float64."""
    if hash_dim < 1:
        raise ValueError(f"{hash_dim=} must be positive")
    x = np.zeros((len(texts), num_features(hash_dim)))
    buckets: dict[str, int] = {}  # word -> hashed column, memoised
    for i, text in enumerate(texts):
        words = text.lower().split()
        x[i, 0] = 1.0
        x[i, 1] = math.log1p(len(words))
        num = _first_number(words)
        if num is not None:
            x[i, 2] = math.log1p(num)
            x[i, 3] = 1.0
        if not words:
            continue
        weight = 1.0 / math.sqrt(len(words))
        row = x[i]
        for k, w in enumerate(words):
            col = buckets.get(w)
            if col is None:
                # surrogatepass: a lone surrogate (JSON's "\ud83d" decodes to one) is a word too;
                # a strict encode raised UnicodeEncodeError. Other words hash as before.
                col = zlib.crc32(w.encode("utf-8", "surrogatepass")) % hash_dim
                buckets[w] = col
            row[_DENSE + col] += weight
            if k < _OPENER_WORDS:
                row[_DENSE + hash_dim + col] += 1.0
    return x
