"""FIM layouts from a vocabulary (one fixture per family) and from a `fim_template` setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmd.config import load_settings
from llmd.engine.fim import Hole, detect_fim_layout, template_layout
from llmd.errors import ConfigError

PREFIX, SUFFIX = Hole.PREFIX, Hole.SUFFIX


def vocabulary(*tokens: str, start: int = 1000) -> dict[str, int]:
    """A vocabulary of ordinary words plus `tokens` (ids from `start`, in order)."""
    return {"def": 1, "return": 2, "▁x": 3} | {token: start + i for i, token in enumerate(tokens)}


QWEN = vocabulary("<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                  "<|repo_name|>", "<|file_sep|>", "<|im_start|>", "<|im_end|>")
STARCODER = vocabulary("<|endoftext|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>",
                       "<repo_name>", "<file_sep>")
CODELLAMA = vocabulary("▁<PRE>", "▁<SUF>", "▁<MID>", "▁<EOT>", start=32007)
DEEPSEEK = vocabulary("<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>", "<｜end▁of▁sentence｜>",
                      start=32014)
CODESTRAL = vocabulary("[PREFIX]", "[SUFFIX]", start=10)


@pytest.mark.parametrize(
    ("vocab", "family", "parts", "ends"),
    [
        (QWEN, "qwen", (1001, PREFIX, 1003, SUFFIX, 1002), (1004, 1006, 1005, 1000)),
        (STARCODER, "starcoder", (1001, PREFIX, 1003, SUFFIX, 1002), (1004, 1006, 1005, 1000)),
        (CODELLAMA, "codellama", (32007, PREFIX, 32008, SUFFIX, 32009), (32010,)),
        (DEEPSEEK, "deepseek", (32015, PREFIX, 32014, SUFFIX, 32016), (32017,)),
        (CODESTRAL, "codestral", (11, SUFFIX, 10, PREFIX), ()),
    ],
)
def test_each_family_is_detected_by_its_tokens(vocab: dict[str, int], family: str, parts: tuple,
                                              ends: tuple[int, ...]) -> None:
    layout = detect_fim_layout(vocab.get)
    assert layout is not None
    assert (layout.family, layout.parts, layout.end_token_ids) == (family, parts, ends)


def test_codellama_without_the_word_start_marker_is_found_too() -> None:
    layout = detect_fim_layout(vocabulary("<PRE>", "<SUF>", "<MID>", "<EOT>").get)
    assert layout is not None and layout.parts == (1000, PREFIX, 1001, SUFFIX, 1002)
    assert layout.end_token_ids == (1003,)


@pytest.mark.parametrize("vocab", [vocabulary(), vocabulary("<|fim_prefix|>", "<|fim_suffix|>"),
                                   vocabulary("[SUFFIX]"), vocabulary("<|im_start|>", "<|im_end|>")])
def test_a_vocabulary_without_a_full_set_has_no_layout(vocab: dict[str, int]) -> None:
    assert detect_fim_layout(vocab.get) is None


def test_a_template_is_cut_at_its_holes_in_either_order() -> None:
    psm = template_layout("<s>[PRE] {prefix} [SUF]{suffix} [MID]", QWEN.get)
    assert psm.parts == ("<s>[PRE] ", PREFIX, " [SUF]", SUFFIX, " [MID]")
    spm = template_layout("{suffix}<x>{prefix}", vocabulary().get)
    assert spm.parts == (SUFFIX, "<x>", PREFIX) and spm.end_token_ids == ()


def test_a_template_ends_at_any_known_end_token() -> None:
    layout = template_layout("<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>", QWEN.get)
    assert layout.family == "template" and set(layout.end_token_ids) == {1000, 1004, 1005, 1006}


@pytest.mark.parametrize("template", ["{prefix} only", "{suffix}{prefix}{prefix}", "neither"])
def test_a_fim_template_needs_each_hole_once(tmp_path: Path, template: str) -> None:
    path = tmp_path / "llmd.yaml"
    path.write_text(f"fim_template: '{template}'\n", "utf-8")
    with pytest.raises(ConfigError, match=r"fim_template.*exactly once") as err:
        load_settings(path, {})
    assert err.value.param == "fim_template"


def test_a_good_fim_template_loads(tmp_path: Path) -> None:
    path = tmp_path / "llmd.yaml"
    path.write_text("fim_template: '<PRE> {prefix} <SUF>{suffix} <MID>'\n", "utf-8")
    assert load_settings(path, {}).fim_template == "<PRE> {prefix} <SUF>{suffix} <MID>"
