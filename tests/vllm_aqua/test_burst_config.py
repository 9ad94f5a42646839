"""benchmarks/aqua_burst.py sizes its engines from the long requests' output length: every long
prompt plus its output fits `max_model_len`, and the cache holds `max_num_seqs` such requests."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import aqua_burst

ASSETS = Path(__file__).resolve().parents[2] / "serving" / "assets" / "tiny_llama"


@pytest.mark.parametrize("long_tokens", [16, 160, 320, 384, 400, 480, 4096])
def test_long_requests_fit_the_engine_for_any_output_length(long_tokens: int) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(ASSETS / "tokenizer.json"))
    cfg = aqua_burst.burst_config(quick=False, long_tokens=long_tokens)
    longest = max(len(tok.encode(p).ids) for p in aqua_burst.long_prompts(cfg))
    assert longest + long_tokens <= cfg["max_model_len"]
    assert cfg["kv_tokens"] == cfg["max_num_seqs"] * cfg["max_model_len"]
    assert cfg["burst_after_tokens"] == long_tokens // 2
