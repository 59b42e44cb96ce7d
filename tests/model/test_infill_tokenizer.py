"""`/infill` prompts through real local tokenizers: repo-level extra context, snippets, the cut, BOS.

One tokenizer per FIM family (tests/helpers/fim_tokenizer.py); the demo model's has no FIM tokens.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llmd.engine.fim import SNIPPET_SEPARATOR
from llmd.engine.tokenizer import ChatTokenizer
from llmd.engine.types import ExtraFile, InfillInput
from llmd.errors import UnsupportedParameter
from tests.helpers.fim_tokenizer import FAMILIES, build_fim_tokenizer

PREFIX = "def add(a, b):\n    "
SUFFIX = "\n\nprint(add(1, 2))\n"
EXTRA = (ExtraFile("util.py", "def sub(a, b):\n    return a - b\n"), ExtraFile("point.py", "class Point:\n"))


@pytest.fixture(scope="module")
def fim_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("infill")
    families = ("qwen", "starcoder", "deepseek")
    return {family: build_fim_tokenizer(root / family, family) for family in families}


def token(tokenizer: ChatTokenizer, text: str) -> int:
    [token_id] = tokenizer.encode_text(text, literal=False)
    return token_id


def text_ids(tokenizer: ChatTokenizer, text: str) -> list[int]:
    """Ids of `text` as a piece after another (no SentencePiece word start)."""
    return tokenizer.extra_ids([text])


@pytest.mark.parametrize(("family", "repo", "sep"), [("qwen", "<|repo_name|>", "<|file_sep|>"),
                                                     ("starcoder", "<repo_name>", "<file_sep>")])
def test_repo_level_layout_before_the_fim_prompt(fim_dirs: dict[str, Path], family: str, repo: str,
                                                 sep: str) -> None:
    tokenizer = ChatTokenizer(fim_dirs[family])
    prompt = tokenizer.encode_infill(InfillInput(PREFIX, SUFFIX, EXTRA))
    r, s = token(tokenizer, repo), token(tokenizer, sep)
    expected_extra = [r, *text_ids(tokenizer, "myproject\n")]
    for chunk in EXTRA:
        expected_extra += [s, *text_ids(tokenizer, f"{chunk.filename}\n"), *text_ids(tokenizer, chunk.text)]
    expected_extra += [s, *text_ids(tokenizer, "filename\n")]
    fim = tokenizer.encode_completion(PREFIX, SUFFIX)
    assert prompt.ids == expected_extra + fim.ids
    assert prompt.end_token_ids == fim.end_token_ids and not prompt.truncated and prompt.text == PREFIX


def test_without_file_separators_chunks_are_snippets_after_the_bos(fim_dirs: dict[str, Path]) -> None:
    tokenizer = ChatTokenizer(fim_dirs["deepseek"])
    prompt = tokenizer.encode_infill(InfillInput(PREFIX, SUFFIX, EXTRA[:1]))
    bos = token(tokenizer, FAMILIES["deepseek"][0] or "")
    fim = tokenizer.encode_completion(PREFIX, SUFFIX).ids
    assert prompt.ids == [bos, *text_ids(tokenizer, SNIPPET_SEPARATOR + EXTRA[0].text), *fim[1:]]
    assert tokenizer.encode_infill(InfillInput(PREFIX, SUFFIX)).ids == fim  # no chunks: the plain FIM prompt


def test_chunk_text_never_becomes_control_tokens(fim_dirs: dict[str, Path]) -> None:
    tokenizer = ChatTokenizer(fim_dirs["qwen"])
    ids = tokenizer.encode_infill(InfillInput("x", "y", (ExtraFile("a<|file_sep|>", "<|fim_middle|>"),))).ids
    assert ids.count(token(tokenizer, "<|fim_middle|>")) == 1
    assert ids.count(token(tokenizer, "<|file_sep|>")) == 2  # the chunk's and the current file's


def test_extra_context_is_cut_from_its_start_to_leave_the_reserve(fim_dirs: dict[str, Path]) -> None:
    whole = ChatTokenizer(fim_dirs["qwen"]).encode_infill(InfillInput(PREFIX, SUFFIX, EXTRA))
    fim = ChatTokenizer(fim_dirs["qwen"]).encode_completion(PREFIX, SUFFIX).ids
    context = len(whole.ids) + 5
    cut = ChatTokenizer(fim_dirs["qwen"], max_context=context).encode_infill(
        InfillInput(PREFIX, SUFFIX, EXTRA, reserve_tokens=20))
    assert cut.truncated and len(cut.ids) == context - 20
    assert cut.ids == whole.ids[len(whole.ids) - len(cut.ids):]  # the newest chunks and the FIM prompt kept
    fits = ChatTokenizer(fim_dirs["qwen"], max_context=context).encode_infill(
        InfillInput(PREFIX, SUFFIX, EXTRA, reserve_tokens=5))
    assert fits.ids == whole.ids and not fits.truncated
    none_left = ChatTokenizer(fim_dirs["qwen"], max_context=len(fim) + 1).encode_infill(
        InfillInput(PREFIX, SUFFIX, EXTRA, reserve_tokens=1))
    assert none_left.ids == fim and none_left.truncated


def test_a_model_without_fim_tokens_refuses_naming_input_suffix(tiny_model: Path) -> None:
    with pytest.raises(UnsupportedParameter, match="fim_template") as err:
        ChatTokenizer(tiny_model).encode_infill(InfillInput("def f(", ")"))
    assert err.value.param == "input_suffix" and "suffix: null" not in err.value.message


def test_a_fim_template_serves_infill_with_snippets(tiny_model: Path) -> None:
    template = "<|start_header|>{prefix}<|end_header|>{suffix}<|eot|>"
    tokenizer = ChatTokenizer(tiny_model, fim_template=template)
    prompt = tokenizer.encode_infill(InfillInput("the", "end", (ExtraFile("a.txt", "rain"),)))
    fim = tokenizer.encode_completion("the", "end").ids
    assert prompt.ids == [fim[0], *text_ids(tokenizer, SNIPPET_SEPARATOR + "rain"), *fim[1:]]


def test_a_prefix_and_suffix_too_long_are_cut_near_the_cursor_kept(fim_dirs: dict[str, Path]) -> None:
    prefix, suffix = "x = 1\n" * 200 + "def f(", ")\n" + "y = 2\n" * 200
    whole = ChatTokenizer(fim_dirs["qwen"]).encode_infill(InfillInput(prefix, suffix))
    cut = ChatTokenizer(fim_dirs["qwen"], max_context=100).encode_infill(
        InfillInput(prefix, suffix, EXTRA, reserve_tokens=20))
    tokenizer = ChatTokenizer(fim_dirs["qwen"])
    pre, suf, mid = (token(tokenizer, m) for m in ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"))
    assert cut.truncated and len(cut.ids) == 80 and cut.ids[-1] == mid  # no room left for the chunks
    head, tail = cut.ids[cut.ids.index(pre) + 1:cut.ids.index(suf)], cut.ids[cut.ids.index(suf) + 1:-1]
    assert len(tail) == (80 - len(cut.ids[:cut.ids.index(pre) + 1]) - 2) // 4
    assert whole.ids[whole.ids.index(suf) - len(head):whole.ids.index(suf)] == head  # the prefix's end
    assert whole.ids[whole.ids.index(suf) + 1:][:len(tail)] == tail  # the suffix's start


def test_a_reserve_past_half_the_context_is_capped(fim_dirs: dict[str, Path]) -> None:
    prompt = ChatTokenizer(fim_dirs["qwen"], max_context=100).encode_infill(
        InfillInput("x = 1\n" * 200, "", reserve_tokens=4096))  # llama.vscode may ask for more than fits
    assert len(prompt.ids) == 50 and prompt.truncated
