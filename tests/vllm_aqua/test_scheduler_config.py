"""The scheduler plug-in's policy options, from vLLM's additional_config or the environment."""

from __future__ import annotations

import pytest

from serving.policies.aqua import AquaFairPolicy


def test_the_aqua_wait_bound_comes_from_the_config_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from serving.vllm_ext.scheduler import policy_from_config

    monkeypatch.delenv("AQUA_MAX_WAIT_ITERS", raising=False)
    monkeypatch.delenv("AQUA_SLICE_ITERS", raising=False)
    default = policy_from_config({})
    assert isinstance(default, AquaFairPolicy) and default.max_wait_iters == 1000
    policy = policy_from_config({"aqua_max_wait_iters": 200, "aqua_slice_iters": "2"})
    assert isinstance(policy, AquaFairPolicy) and (policy.max_wait_iters, policy.slice_iters) == (200, 2)
    policy = policy_from_config({"aqua_policy_options": {"max_wait_iters": 300}})
    assert isinstance(policy, AquaFairPolicy) and policy.max_wait_iters == 300
    monkeypatch.setenv("AQUA_MAX_WAIT_ITERS", "400")
    policy = policy_from_config(None)
    assert isinstance(policy, AquaFairPolicy) and policy.max_wait_iters == 400


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("soon", "aqua_max_wait_iters must be an integer, got 'soon'"),
        ([5], "aqua_max_wait_iters must be"),
        (0, "max_wait_iters must be a positive integer, got 0"),
        # Regression: int() took these, so `true` aged every served request after one iteration.
        (True, "aqua_max_wait_iters must be an integer, got True"),
        (2.5, "aqua_max_wait_iters must be an integer, got 2.5"),
    ],
)
def test_a_bad_wait_bound_is_refused_by_name(value: object, message: str) -> None:
    from serving.vllm_ext.scheduler import policy_from_config

    with pytest.raises(ValueError, match=message):
        policy_from_config({"aqua_max_wait_iters": value})


@pytest.mark.parametrize("value", [True, 2.5])
def test_a_bad_slice_is_refused_by_name(value: object) -> None:
    from serving.vllm_ext.scheduler import policy_from_config

    with pytest.raises(ValueError, match=f"aqua_slice_iters must be an integer, got {value!r}"):
        policy_from_config({"aqua_slice_iters": value})


def test_integral_numbers_of_any_spelling_are_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    from serving.vllm_ext.scheduler import policy_from_config

    monkeypatch.setenv("AQUA_SLICE_ITERS", " 3 ")
    policy = policy_from_config({"aqua_max_wait_iters": 500.0})
    assert isinstance(policy, AquaFairPolicy) and (policy.max_wait_iters, policy.slice_iters) == (500, 3)
