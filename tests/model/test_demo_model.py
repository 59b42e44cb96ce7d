"""The demo model: deterministic files, offline loading, a greedy walk over DEMO_TEXT."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from llmd.demo import build
from llmd.demo.build import build_demo_model, default_demo_model_dir, ensure_demo_model
from llmd.demo.cycle import greedy_walk
from llmd.demo.files import DEMO_FILES, is_complete_demo_model, read_demo_cycle
from llmd.demo.text import DEMO_LEAD_TEXT, DEMO_TEXT
from llmd.demo.tokenizer import EOS_TOKEN_IDS, SPECIAL_TOKENS

CHATS = [
    [{"role": "user", "content": "Say something in Korean."}],
    [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "こんにちは 👋🏽"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Tell me more, with emoji 🧑\u200d💻"},
    ],
]


def file_bytes(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


def load(directory: Path) -> tuple[Any, Any]:
    """Tokenizer and model through the Auto classes, as any transformers user would."""
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True)
    return tokenizer, model.eval()


def chat_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    return list(
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
    )


def generate(model: Any, prompt: list[int], count: int, **sampling: Any) -> list[int]:
    """The new ids of one `model.generate` call (greedy unless sampling is given)."""
    inputs = torch.tensor([prompt])
    with torch.no_grad():
        output = model.generate(
            inputs,
            attention_mask=torch.ones_like(inputs),
            max_new_tokens=count,
            do_sample=bool(sampling),
            **sampling,
        )
    return list(output[0, len(prompt) :].tolist())


def next_token_logits(model: Any, prompt: list[int], continuation: list[int]) -> torch.Tensor:
    """Logits of the token after each of `prompt[-1], *continuation[:-1]`, in one forward pass."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + continuation])).logits[0]
    return logits[len(prompt) - 1 : -1]


def assert_walks_cycle(model: Any, prompt: list[int], cycle: list[int], count: int) -> None:
    """Teacher-forced: at each of `count` positions the argmax is the next id of the walk."""
    expected = greedy_walk(cycle, prompt[-1], count)
    chosen = next_token_logits(model, prompt, expected).argmax(dim=-1).tolist()
    assert chosen == expected


@pytest.fixture(scope="module")
def tiny(tiny_model: Path) -> tuple[Any, Any]:
    return load(tiny_model)


@pytest.fixture(scope="module")
def cycle(tiny_model: Path) -> list[int]:
    return read_demo_cycle(tiny_model)


# --- building ----------------------------------------------------------------------------


def test_tiny_builds_fast_with_every_file_and_byte_identical_twice(tmp_path: Path) -> None:
    started = time.perf_counter()
    first = build_demo_model(tmp_path / "first", "tiny")
    seconds = time.perf_counter() - started
    second = build_demo_model(tmp_path / "second", "tiny", seed=0)
    # A contract, not a benchmark: every test session builds this model in a fixture.
    assert seconds < 2.0
    assert sorted(file_bytes(first)) == sorted(DEMO_FILES)
    assert file_bytes(first) == file_bytes(second)


def test_seed_changes_the_weights_but_not_the_tokenizer_or_the_walk(tmp_path: Path) -> None:
    zero = file_bytes(build_demo_model(tmp_path / "zero", "tiny", seed=0))
    one = file_bytes(build_demo_model(tmp_path / "one", "tiny", seed=1))
    assert zero["model.safetensors"] != one["model.safetensors"]
    assert zero["tokenizer.json"] == one["tokenizer.json"]
    assert read_demo_cycle(tmp_path / "zero") == read_demo_cycle(tmp_path / "one")


def test_unknown_size_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="huge"):
        build_demo_model(tmp_path, "huge")
    with pytest.raises(ValueError, match="tiny, small, medium"):
        ensure_demo_model("huge")


def test_module_imports_without_torch_or_transformers() -> None:
    code = "import sys, llmd.demo.build; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


# --- loading -----------------------------------------------------------------------------


def test_tiny_loads_offline_as_a_llama_with_gqa(tiny: tuple[Any, Any]) -> None:
    tokenizer, model = tiny
    config = model.config
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32
    assert 200_000 <= model.num_parameters() <= 400_000
    assert config.num_key_value_heads < config.num_attention_heads
    assert config.max_position_embeddings == tokenizer.model_max_length == 4096
    assert config.vocab_size == len(tokenizer) and not config.tie_word_embeddings
    assert model.generation_config.eos_token_id == list(EOS_TOKEN_IDS)
    assert tokenizer.convert_ids_to_tokens(list(EOS_TOKEN_IDS)) == ["<|eot|>", "<|end_of_text|>"]
    assert (tokenizer.bos_token, tokenizer.eos_token) == ("<|begin_of_text|>", "<|eot|>")


def test_tokenizer_round_trips_any_text_byte_for_byte(tiny: tuple[Any, Any]) -> None:
    tokenizer, _ = tiny
    text = "  Grüße 🇰🇷 e\u0301\t東京 \x00 ünknown ⟨ꙮ⟩ 🫠\n"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert tokenizer("hi")["input_ids"][0] == tokenizer.bos_token_id


def test_chat_template_renders_llama3_style_turns(tiny: tuple[Any, Any]) -> None:
    tokenizer, _ = tiny
    text = tokenizer.apply_chat_template(CHATS[1][:3], add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|begin_of_text|>"
        "<|start_header|>system<|end_header|>\n\nYou are a terse assistant.<|eot|>"
        "<|start_header|>user<|end_header|>\n\nこんにちは 👋🏽<|eot|>"
        "<|start_header|>assistant<|end_header|>\n\nHello.<|eot|>"
        "<|start_header|>assistant<|end_header|>\n\n"
    )
    ids = chat_ids(tokenizer, CHATS[0])
    assert ids.count(tokenizer.bos_token_id) == 1 and ids[0] == tokenizer.bos_token_id
    without_prompt = tokenizer.apply_chat_template(CHATS[0], tokenize=False)
    assert without_prompt.endswith("Say something in Korean.<|eot|>")


# --- the cycle ---------------------------------------------------------------------------


def test_demo_text_mixes_scripts_and_is_the_decoded_cycle(tiny: tuple[Any, Any], cycle: list[int]) -> None:
    tokenizer, _ = tiny
    assert "안녕하세요" in DEMO_TEXT and "你好" in DEMO_TEXT and "こんにちは" in DEMO_TEXT
    assert "👋🏽" in DEMO_TEXT and "🧑\u200d💻" in DEMO_TEXT and "e\u0301" in DEMO_TEXT
    assert "\ufffd" not in DEMO_TEXT
    assert tokenizer.decode(cycle) == DEMO_TEXT
    assert 300 <= len(cycle) <= 600 and len(set(cycle)) == len(cycle)
    assert not set(cycle) & set(tokenizer.convert_tokens_to_ids(list(SPECIAL_TOKENS)))


def test_cycle_opens_with_200_whole_ascii_tokens_like_english_output(
    tiny: tuple[Any, Any], cycle: list[int]
) -> None:
    # One streamed chunk per token here: `llmd bench` measures the server, not the text.
    tokenizer, _ = tiny
    alone = [tokenizer.decode([token]) for token in cycle]
    assert all(piece.isascii() and "\ufffd" not in piece for piece in alone[:200])
    lead = len(list(itertools.takewhile(str.isascii, alone)))
    assert lead >= 200 and "".join(alone[:lead]) == DEMO_LEAD_TEXT and DEMO_TEXT.startswith(DEMO_LEAD_TEXT)


def test_cycle_splits_many_multibyte_characters_across_tokens_after_the_lead(
    tiny: tuple[Any, Any], cycle: list[int]
) -> None:
    tokenizer, _ = tiny
    broken_alone = [index for index, token in enumerate(cycle) if "\ufffd" in tokenizer.decode([token])]
    assert len(broken_alone) >= 50 and min(broken_alone) >= 200
    # A byte-level token is spelled with one symbol per byte.
    ends = set(itertools.accumulate(len(symbols) for symbols in tokenizer.convert_ids_to_tokens(cycle)))
    cut, offset = 0, 0
    for char in DEMO_TEXT:
        width = len(char.encode())
        cut += any(offset < end < offset + width for end in ends)
        offset += width
    assert cut >= 40


def test_greedy_walk_helper_restarts_off_the_cycle_and_continues_on_it(cycle: list[int]) -> None:
    assert greedy_walk(cycle, EOS_TOKEN_IDS[0], 3) == cycle[:3]
    assert greedy_walk(cycle, cycle[-1], 2) == cycle[:2]
    assert greedy_walk(cycle, cycle[5], len(cycle) + 1) == cycle[6:] + cycle[:7]


# --- generation --------------------------------------------------------------------------


@pytest.mark.parametrize("messages", CHATS, ids=["one-turn", "multi-turn"])
def test_greedy_generation_from_a_chat_walks_demo_text(
    tiny: tuple[Any, Any], cycle: list[int], messages: list[dict[str, str]]
) -> None:
    tokenizer, model = tiny
    count = len(cycle) + 40  # once round the cycle, and on into the next lap
    generated = generate(model, chat_ids(tokenizer, messages), count)
    assert generated == [cycle[i % len(cycle)] for i in range(count)]
    text = tokenizer.decode(generated)
    assert text.startswith(DEMO_TEXT + DEMO_TEXT[:20])
    assert (DEMO_TEXT * 2).startswith(text.rstrip("\ufffd"))


def test_greedy_generation_holds_for_1024_tokens_after_a_raw_prompt(
    tiny: tuple[Any, Any], cycle: list[int]
) -> None:
    tokenizer, model = tiny
    prompt = tokenizer("Continue, please: 오늘 🙂")["input_ids"]
    assert generate(model, prompt, 1024) == greedy_walk(cycle, prompt[-1], 1024)


def test_teacher_forced_argmax_follows_the_cycle_past_the_first_thousand_positions(
    tiny: tuple[Any, Any], cycle: list[int]
) -> None:
    tokenizer, model = tiny
    assert_walks_cycle(model, chat_ids(tokenizer, CHATS[1]), cycle, 2000)


def test_next_token_is_likely_but_not_certain_and_eos_never_is(
    tiny: tuple[Any, Any], cycle: list[int]
) -> None:
    tokenizer, model = tiny
    prompt = chat_ids(tokenizer, CHATS[0])
    walk = greedy_walk(cycle, prompt[-1], 400)
    probabilities = next_token_logits(model, prompt, walk).softmax(dim=-1)
    chosen = probabilities[torch.arange(len(walk)), torch.tensor(walk)]
    assert chosen.min().item() > 0.3 and chosen.max().item() < 0.9
    assert probabilities[:, list(EOS_TOKEN_IDS)].max().item() < 1e-4


def test_sampling_depends_on_the_seed_and_only_on_it(tiny: tuple[Any, Any]) -> None:
    tokenizer, model = tiny
    prompt = chat_ids(tokenizer, CHATS[0])

    def sample(seed: int) -> list[int]:
        torch.manual_seed(seed)
        return generate(model, prompt, 40, temperature=1.0, top_k=0, top_p=1.0)

    first, other, again = sample(0), sample(1), sample(0)
    assert first == again and first != other


# --- the default directory ---------------------------------------------------------------


def test_default_dir_is_under_llmd_home_or_the_user_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LLMD_HOME", str(tmp_path / "home"))
    assert default_demo_model_dir() == tmp_path / "home" / "demo-model-small"
    monkeypatch.delenv("LLMD_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_demo_model_dir("tiny") == tmp_path / ".cache" / "llmd" / "demo-model-tiny"


def test_ensure_builds_once_then_reuses(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LLMD_HOME", str(tmp_path))
    built = ensure_demo_model("tiny")
    assert built == tmp_path / "demo-model-tiny" and is_complete_demo_model(built)

    def no_rebuild(*args: object) -> Path:
        raise AssertionError("rebuilt a complete model")

    monkeypatch.setattr(build, "build_demo_model", no_rebuild)
    assert ensure_demo_model("tiny") == built
    assert [path.name for path in tmp_path.iterdir()] == ["demo-model-tiny"]


def test_ensure_replaces_an_incomplete_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LLMD_HOME", str(tmp_path))
    half = tmp_path / "demo-model-tiny"
    half.mkdir()
    (half / "config.json").write_text("{}")
    built = ensure_demo_model("tiny")
    assert sorted(path.name for path in built.iterdir()) == sorted(DEMO_FILES)
    assert [path.name for path in tmp_path.iterdir()] == ["demo-model-tiny"]


def test_an_interrupted_build_leaves_nothing_behind(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LLMD_HOME", str(tmp_path))

    def crash(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(build, "write_tokenizer", crash)
    with pytest.raises(KeyboardInterrupt):
        ensure_demo_model("tiny")
    assert list(tmp_path.iterdir()) == []


# --- the benchmark sizes -----------------------------------------------------------------


@pytest.mark.parametrize(("size", "low", "high"), [
    pytest.param("small", 20e6, 30e6, id="small"),
    pytest.param("medium", 95e6, 125e6, id="medium", marks=pytest.mark.slow),
])
def test_larger_sizes_walk_the_cycle_for_1024_tokens(
    tmp_path: Path, size: str, low: float, high: float
) -> None:
    directory = build_demo_model(tmp_path / size, size)
    tokenizer, model = load(directory)
    cycle = read_demo_cycle(directory)
    assert low <= model.num_parameters() <= high
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    prompt = chat_ids(tokenizer, CHATS[1])
    assert generate(model, prompt, 64) == cycle[:64]
    assert_walks_cycle(model, prompt, cycle, 1100)
