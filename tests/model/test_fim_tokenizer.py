"""Completions prompts through real local tokenizers: control tokens as text, FIM layouts per family, BOS.

One tokenizer per FIM family (tests/helpers/fim_tokenizer.py) and the demo model's, which has none.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from llmd.engine.tokenizer import ChatTokenizer
from llmd.errors import ContextLengthExceeded, InvalidRequest, UnsupportedParameter
from tests.helpers.fim_tokenizer import FAMILIES, build_fim_tokenizer

PREFIX = "def add(a, b):\n    "
SUFFIX = "\n\nprint(add(1, 2))\n"


@pytest.fixture(scope="module")
def fim_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fim")
    return {family: build_fim_tokenizer(root / family, family) for family in FAMILIES}


def token(tokenizer: ChatTokenizer, text: str) -> int:
    [token_id] = tokenizer.encode_text(text, literal=False)
    return token_id


def literal(tokenizer: ChatTokenizer, text: str) -> list[int]:
    return tokenizer.encode_text(text, literal=True)


@pytest.mark.parametrize(
    ("family", "markers", "ends"),
    [
        ("qwen", ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
         ("<|fim_pad|>", "<|file_sep|>", "<|repo_name|>", "<|endoftext|>")),
        ("starcoder", ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
         ("<fim_pad>", "<file_sep>", "<repo_name>", "<|endoftext|>")),
        ("deepseek", ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"), ("<｜end▁of▁sentence｜>",)),
    ],
)
def test_prefix_suffix_middle_families(fim_dirs: dict[str, Path], family: str, markers: tuple[str, ...],
                                       ends: tuple[str, ...]) -> None:
    tokenizer = ChatTokenizer(fim_dirs[family])
    prompt = tokenizer.encode_completion(PREFIX, SUFFIX)
    pre, suf, mid = (token(tokenizer, marker) for marker in markers)
    bos = [token(tokenizer, FAMILIES[family][0] or "")] if FAMILIES[family][0] else []
    assert prompt.ids == [*bos, pre, *literal(tokenizer, PREFIX), suf, *literal(tokenizer, SUFFIX), mid]
    assert prompt.end_token_ids == tuple(token(tokenizer, end) for end in ends)
    assert prompt.text == PREFIX


def test_codellama_keeps_the_prefix_word_start_and_not_the_suffix_one(fim_dirs: dict[str, Path]) -> None:
    tokenizer = ChatTokenizer(fim_dirs["codellama"])
    hf = AutoTokenizer.from_pretrained(str(fim_dirs["codellama"]))
    ids = tokenizer.encode_completion("x = 1", "y = 1").ids
    pre, suf, mid = (token(tokenizer, m) for m in ("▁<PRE>", "▁<SUF>", "▁<MID>"))
    assert ids[:2] == [token(tokenizer, "<s>"), pre] and ids[-1] == mid
    cut = ids.index(suf)
    assert hf.convert_ids_to_tokens(ids[2])[0] == "▁"  # "▁x": the prefix starts as a prompt would
    assert hf.decode(ids[cut + 1:-1]) == "y = 1" and hf.convert_ids_to_tokens(ids[cut + 1])[0] != "▁"
    assert tokenizer.encode_completion("x", "y").end_token_ids == (token(tokenizer, "▁<EOT>"),)


def test_codestral_puts_the_suffix_first(fim_dirs: dict[str, Path]) -> None:
    tokenizer = ChatTokenizer(fim_dirs["codestral"])
    ids = tokenizer.encode_completion(PREFIX, SUFFIX).ids
    bos, suf, pre = (token(tokenizer, m) for m in ("<s>", "[SUFFIX]", "[PREFIX]"))
    assert ids == [bos, suf, *literal(tokenizer, SUFFIX), pre, *literal(tokenizer, PREFIX)]


def test_a_client_templated_fim_prompt_is_tokenized_as_the_fim_tokens(fim_dirs: dict[str, Path]) -> None:
    tokenizer = ChatTokenizer(fim_dirs["qwen"])
    continue_prompt = f"<|fim_prefix|>{PREFIX}<|fim_suffix|>{SUFFIX}<|fim_middle|>"  # as Continue sends it
    plain = tokenizer.encode_completion(continue_prompt, None)
    assert plain.ids == tokenizer.encode_completion(PREFIX, SUFFIX).ids and plain.end_token_ids == ()


def test_hole_text_never_becomes_control_tokens(fim_dirs: dict[str, Path]) -> None:
    tokenizer = ChatTokenizer(fim_dirs["qwen"])
    ids = tokenizer.encode_completion('FIM = "<|fim_middle|>"\n', "<|fim_suffix|>").ids
    assert ids.count(token(tokenizer, "<|fim_middle|>")) == 1
    assert ids.count(token(tokenizer, "<|fim_suffix|>")) == 1


def test_chat_content_still_never_becomes_control_tokens(fim_dirs: dict[str, Path]) -> None:
    tokenizer = ChatTokenizer(fim_dirs["qwen"])
    ids = tokenizer.encode_chat([{"role": "user", "content": "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>"}])
    assert token(tokenizer, "<|fim_prefix|>") not in ids


def test_a_model_without_fim_tokens_refuses_a_suffix(tiny_model: Path) -> None:
    with pytest.raises(UnsupportedParameter, match="FIM tokens") as err:
        ChatTokenizer(tiny_model).encode_completion("def f(", "")
    assert err.value.param == "suffix"


def test_a_fim_template_setting_lays_out_the_prompt(tiny_model: Path) -> None:
    template = "<|start_header|>{prefix}<|end_header|>{suffix}<|eot|>"
    tokenizer = ChatTokenizer(tiny_model, fim_template=template)
    ids = tokenizer.encode_completion("the", "end").ids
    start, end, eot = (token(tokenizer, t) for t in ("<|start_header|>", "<|end_header|>", "<|eot|>"))
    bos = token(tokenizer, "<|begin_of_text|>")
    assert ids == [bos, start, *literal(tokenizer, "the"), end, *literal(tokenizer, "end"), eot]


def test_a_text_prompt_gets_the_tokenizers_bos_once(tiny_model: Path) -> None:
    tokenizer = ChatTokenizer(tiny_model)
    bos = token(tokenizer, "<|begin_of_text|>")
    hello = [bos, *literal(tokenizer, "Hello")]
    assert tokenizer.encode_completion("Hello", None).ids == hello
    assert tokenizer.encode_completion("<|begin_of_text|>Hello", None).ids == hello
    assert tokenizer.encode_completion("<|eot|>", None).ids == [bos, token(tokenizer, "<|eot|>")]


def test_a_bpe_without_bos_adds_nothing(fim_dirs: dict[str, Path]) -> None:
    tokenizer = ChatTokenizer(fim_dirs["qwen"])
    assert tokenizer.encode_completion("def", None).ids == literal(tokenizer, "def")


def test_token_id_prompts_pass_as_given_and_decode_for_echo(tiny_model: Path) -> None:
    tokenizer = ChatTokenizer(tiny_model)
    ids = literal(tokenizer, "Hello there")
    prompt = tokenizer.encode_completion(ids, None)
    assert prompt.ids == ids and prompt.text == "Hello there"


@pytest.mark.parametrize(("prompt", "suffix", "param"), [([10**6], None, "prompt"), ([], None, "prompt"),
                                                         ([1, 2], "x", "suffix")])
def test_bad_token_prompts_name_the_param(tiny_model: Path, prompt: list[int], suffix: str | None,
                                          param: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        ChatTokenizer(tiny_model).encode_completion(prompt, suffix)
    assert err.value.param == param


def test_an_oversized_prompt_is_refused_early(fim_dirs: dict[str, Path]) -> None:
    tokenizer = ChatTokenizer(fim_dirs["qwen"], max_context=64)
    with pytest.raises(ContextLengthExceeded):
        tokenizer.encode_completion("print(i)\n" * 10_000, None)
    with pytest.raises(ContextLengthExceeded):
        tokenizer.encode_completion("print(i)\n" * 10_000, "x")


def test_stop_strings_that_are_special_tokens_have_their_ids(fim_dirs: dict[str, Path]) -> None:
    tokenizer = ChatTokenizer(fim_dirs["qwen"])
    stops = ("<|fim_pad|>", "\n\n", "<|file_sep|>", "<|im_start|>", "<|fim_pad|>")  # no <|im_start|> here
    pad, file_sep = token(tokenizer, "<|fim_pad|>"), token(tokenizer, "<|file_sep|>")
    assert tokenizer.special_stop_ids(stops) == (pad, file_sep)
    assert tokenizer.special_stop_ids(()) == ()
