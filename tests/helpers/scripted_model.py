"""A tiny random-weight Llama whose greedy reply to any chat is a given script, then end of turn.

Built offline in well under a second from the demo model's parts: the demo tokenizer with each
script piece added as one token (plus the marker strings a chat template uses), and the demo
weights made to walk a cycle of those pieces. Tool-call and reasoning tests script exactly what
a real model would write (`<tool_call>`, `</think>`, `[TOOL_CALLS]`...) and assert on the wire.

How greedy decoding enters and leaves the script: `demo_weights` makes every token outside the
cycle lead to the cycle's first id, and each cycle id lead to the next. The cycle is the script's
ids followed by a spare id (the NUL byte, which no prompt or grammar needs); the spare's lm_head
row is then swapped with the end-of-turn token's, so the last piece leads to `<|eot|>` and the
spare, like every demo special token, is never chosen. A chat prompt that ends with a token
outside the script therefore starts the script at its first piece (sampling too: the logits are
sharpened until a stray token is vanishingly unlikely); one that ends with a script
piece would start mid-script, so `build_scripted_model` refuses a script whose piece ends the
template's generation prompt for a one-user-message chat (other template options, such as
`enable_thinking`, are the caller's to keep clear).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file
from tokenizers import AddedToken, Tokenizer

from llmd.demo.files import generation_config, model_config, tokenizer_config, write_json
from llmd.demo.sizes import demo_size
from llmd.demo.tokenizer import EOT_TOKEN_ID, SPECIAL_TOKENS, train_tokenizer
from llmd.demo.weights import demo_weights

SCRIPT_FILE = "llmd_scripted.json"
# The byte-level symbol of byte 0x00: a token no prompt, reply or grammar ever needs.
_SPARE_SYMBOL = "\u0100"
_SEEDS = range(16)
# The demo's logit scale leaves sampling at temperature 1 free to wander (its top token has p ~ 0.7);
# scaled up, sampling follows the script too (a stray token has p < 1e-9), so a client that sends
# no temperature (OpenAI's default is 1) still sees the script. The argmax is unchanged.
_SHARPNESS = 8.0


def build_scripted_model(
    directory: Path,
    script: Sequence[str],
    chat_template: str,
    special: Sequence[str] = (),
    markers: Sequence[str] = (),
) -> Path:
    """Write a model into `directory` whose greedy reply to any chat is `script` joined, then EOT.

    Each piece of `script` is one token (pieces must be distinct and non-empty); `markers` become
    plain added tokens (decoded as text) and `special` special ones, as a real model's
    `<tool_call>` and `[TOOL_CALLS]` are. A piece may also be a marker or special token: it keeps
    that token. `chat_template` goes into tokenizer_config.json. Returns `directory`.
    """
    tokenizer = scripted_tokenizer(script, special, markers)
    ids = script_ids(tokenizer, script)
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    shape = demo_size("tiny")
    directory.mkdir(parents=True, exist_ok=True)
    save_file(_scripted_weights(vocab_size, ids, tokenizer), str(directory / "model.safetensors"),
              metadata={"format": "pt"})
    write_json(directory / "config.json", model_config(shape, vocab_size))
    write_json(directory / "generation_config.json", generation_config())
    (directory / "tokenizer.json").write_text(tokenizer.to_str(pretty=True) + "\n", "utf-8")
    write_json(directory / "tokenizer_config.json", tokenizer_config() | {"chat_template": chat_template})
    write_json(directory / SCRIPT_FILE, {"script": list(script), "ids": ids})
    _check_entry(directory, ids)
    return directory


def scripted_tokenizer(script: Sequence[str], special: Sequence[str], markers: Sequence[str]) -> Tokenizer:
    """The demo tokenizer plus `markers` and the script's pieces as plain tokens, `special` as special."""
    _check_script(script)
    tokenizer = train_tokenizer()
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in special])
    plain = [token for token in dict.fromkeys([*markers, *script]) if token not in special]
    tokenizer.add_tokens([AddedToken(token, special=False, normalized=False) for token in plain])
    return tokenizer


def script_ids(tokenizer: Tokenizer, script: Sequence[str]) -> list[int]:
    """The token id of each piece, in order."""
    ids = [tokenizer.token_to_id(piece) for piece in script]
    missing = [piece for piece, token_id in zip(script, ids, strict=True) if token_id is None]
    if missing:
        raise ValueError(f"pieces missing from the tokenizer: {missing!r}")
    return [token_id for token_id in ids if token_id is not None]


def read_script_ids(directory: Path) -> list[int]:
    """The ids greedy decoding yields before the end of turn, as `build_scripted_model` recorded."""
    return [int(token_id) for token_id in json.loads((directory / SCRIPT_FILE).read_text("utf-8"))["ids"]]


def _check_script(script: Sequence[str]) -> None:
    """Pieces must be distinct (a cycle visits each id once), non-empty, and not demo specials."""
    if len(set(script)) != len(script):
        raise ValueError(f"script pieces must be distinct: {list(script)!r}")
    if any(not piece or piece in SPECIAL_TOKENS for piece in script):
        raise ValueError(f"script pieces must be non-empty, not demo special tokens: {list(script)!r}")


def _check_entry(directory: Path, ids: Sequence[int]) -> None:
    """Refuse a script whose piece ends the template's generation prompt: greedy would start after it."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    chat = [{"role": "user", "content": "Hi"}]
    text = hf.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    last = hf.encode(str(text), add_special_tokens=False)[-1]
    if last in ids:
        raise ValueError(f"the generation prompt ends with script piece {hf.decode([last])!r}")


def _scripted_weights(vocab_size: int, ids: Sequence[int], tokenizer: Tokenizer) -> dict[str, np.ndarray]:
    """Demo weights over the cycle script + spare, with the spare's lm_head row given to EOT."""
    spare = tokenizer.token_to_id(_SPARE_SYMBOL)
    assert spare is not None, "every byte is a token of the demo tokenizer"
    cycle = [*ids, spare]
    tensors = _demo_weights_any_seed(vocab_size, cycle)
    head = tensors["lm_head.weight"]
    head[[spare, EOT_TOKEN_ID]] = head[[EOT_TOKEN_ID, spare]]
    head *= np.float32(_SHARPNESS)
    return tensors


def _demo_weights_any_seed(vocab_size: int, cycle: Sequence[int]) -> dict[str, np.ndarray]:
    """`demo_weights` with the first seed whose greedy margins hold (almost always seed 0)."""
    for seed in _SEEDS:
        try:
            return demo_weights(demo_size("tiny"), vocab_size, cycle, seed)
        except RuntimeError:
            continue
    raise RuntimeError(f"no seed in {_SEEDS} gives clear greedy margins for this script")
