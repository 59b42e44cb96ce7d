"""`logit_bias` from the wire (token-id strings to -100..100) to the engine's (id, bias) pairs."""

from __future__ import annotations

import pytest

from llmd.api.logit_bias import MAX_BIASED_TOKENS, parse_logit_bias
from llmd.errors import InvalidRequest


def test_keys_become_token_ids_in_order() -> None:
    assert parse_logit_bias({"50256": -100, "0": 100, "17": 0.5}) == ((50256, -100), (0, 100), (17, 0.5))


@pytest.mark.parametrize("bias", [None, {}])
def test_null_or_empty_is_no_bias(bias: dict[str, float] | None) -> None:
    assert parse_logit_bias(bias) == ()


@pytest.mark.parametrize("bias", [{"abc": 1}, {"-1": 1}, {"1.5": 1}, {" 7": 1}, {"": 1}, {"١٢": 1},
                                  {"7": 100.5}, {"7": -101}, {"7": float("nan")}])
def test_a_bad_key_or_value_names_logit_bias(bias: dict[str, float]) -> None:
    with pytest.raises(InvalidRequest) as err:
        parse_logit_bias(bias)
    assert err.value.param == "logit_bias" and err.value.status == 400


def test_too_many_entries_are_refused() -> None:
    assert len(parse_logit_bias({str(i): 1 for i in range(MAX_BIASED_TOKENS)})) == MAX_BIASED_TOKENS
    with pytest.raises(InvalidRequest, match=f"at most {MAX_BIASED_TOKENS}") as err:
        parse_logit_bias({str(i): 1 for i in range(MAX_BIASED_TOKENS + 1)})
    assert err.value.param == "logit_bias"
