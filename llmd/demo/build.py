"""A random-weight Llama model whose greedy output is a known, multilingual text.

`build_demo_model` writes a Hugging Face model directory (config, safetensors weights, a
byte-level BPE tokenizer trained here, a Llama-3 style chat template) that transformers loads
offline. Its attention and MLP weights are random; its embeddings and lm_head are arranged so
that greedy decoding walks a fixed cycle of distinct token ids whose decoded text is
`DEMO_TEXT`, while sampling at temperature 1.0 still varies. That makes engine output exactly
testable. The cycle opens with `DEMO_LEAD_TEXT`, over 200 tokens of English that are each whole
ASCII, so streaming benchmarks see one chunk per token as with real English output; the
multilingual rest splits many multibyte characters across tokens to exercise UTF-8-safe
streaming.

Weights are written with numpy only: this module must not import torch or transformers.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers


@dataclass(frozen=True)
class DemoModelSize:
    """Shape of one demo model size (the vocabulary is the tokenizer's, shared by all sizes)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden_size // self.num_heads


SIZES: dict[str, DemoModelSize] = {
    "tiny": DemoModelSize(hidden_size=64, intermediate_size=256, num_layers=2, num_heads=4, num_kv_heads=2),
    "small": DemoModelSize(
        hidden_size=512, intermediate_size=1536, num_layers=8, num_heads=8, num_kv_heads=2
    ),
    "medium": DemoModelSize(
        hidden_size=768, intermediate_size=2688, num_layers=14, num_heads=12, num_kv_heads=4
    ),
}

BOS_TOKEN = "<|begin_of_text|>"
END_OF_TEXT_TOKEN = "<|end_of_text|>"
START_HEADER_TOKEN = "<|start_header|>"
END_HEADER_TOKEN = "<|end_header|>"
EOT_TOKEN = "<|eot|>"
# The trainer gives special tokens the first ids, in this order.
SPECIAL_TOKENS = (BOS_TOKEN, END_OF_TEXT_TOKEN, START_HEADER_TOKEN, END_HEADER_TOKEN, EOT_TOKEN)
BOS_TOKEN_ID = SPECIAL_TOKENS.index(BOS_TOKEN)
END_OF_TEXT_TOKEN_ID = SPECIAL_TOKENS.index(END_OF_TEXT_TOKEN)
EOT_TOKEN_ID = SPECIAL_TOKENS.index(EOT_TOKEN)
# Generation stops at the end of a turn (chat) or at the end of the text; neither is ever greedy.
EOS_TOKEN_IDS = (EOT_TOKEN_ID, END_OF_TEXT_TOKEN_ID)

MAX_POSITION_EMBEDDINGS = 4096
ROPE_THETA = 500000.0
RMS_NORM_EPS = 1e-5
MANIFEST_FILE = "llmd_demo.json"

# Greedy output opens with this English lead, the way real chat output mostly looks: every token
# is whole ASCII, so a UTF-8-safe streamer sends one chunk per token and `llmd bench` measures
# the server, not the text. A cycle of distinct ids cannot reuse a token, so each punctuation
# run occurs once and common short words only a few times.
DEMO_LEAD_TEXT = (
    "Hello! I'm the llmd demo model; my weights are random, yet greedy decoding walks this fixed "
    "text so tests can check every reply exactly. This opening paragraph stays in plain English "
    "because benchmarks measure smoothness here: each piece decodes alone as whole ASCII which "
    "mirrors how real chat output reaches streaming clients (roughly one chunk per generated "
    "token). Gaps between chunks should look even while our server batches many requests "
    "together without stalls or hiccups... Think of reporters typing notes into live feeds where "
    "nobody waits for full paragraphs - words appear instantly and that rhythm is what latency "
    "charts try to capture when someone runs `llmd bench`. Why care? Because jarring replies "
    'stall then dump three sentences at once -- users call it "stuttering." Steady pacing '
    "matters most during lengthy answers since readers skim ahead whenever fresh lines arrive but "
    "smooth trickles feel quicker than sudden bursts although total time stays identical!! Naturally "
    "hardware differs widely hence absolute numbers vary [ratios remain comparable] Further along "
    "comes harder material with Korean syllables plus Chinese characters beside Japanese "
    "kana or emoji whose bytes span several tokens -> any detokenizer must therefore hold back "
    "partial sequences until each character is complete :)"
)

# The multilingual rest splits many characters across two to four tokens, which UTF-8-safe
# streaming must hold back. Hangul and emoji follow the lead at once: end-to-end tests look for
# them within the first 400 tokens.
_DEMO_WORLD_TEXT = (
    " 안녕하세요 👋🏽 你好，世界！ こんにちは、元気ですか？ Привет мир 🌍 Γειά σου κόσμε "
    "Grüße aus Köln — café oder cafe\u0301 mit kombinierendem Akzent 🧑\u200d💻 오늘 날씨가 좋네요 "
    "我们一起学习。 नमस्ते 🇰🇷 Emoji like 👍🏿 and 👨\u200d👩\u200d👧 arrive piecewise ✨ "
    "한국어 글자는 세 바이트입니다 「中文字符占三个字节」 Streams never show half glyphs "
    "ありがとう Thanks for reading… now the loop starts over "
)

DEMO_TEXT = DEMO_LEAD_TEXT + _DEMO_WORLD_TEXT

# English and code weigh double, as in the corpora real tokenizers learn from; the other scripts
# appear once, so only their common characters merge and most keep their bytes apart.
_CORPUS_LATIN = (
    (
        "The daemon loads one causal language model and serves it to many clients. Each request "
        "is queued, batched with its neighbours, and streamed back one token at a time. A token "
        "is not a character: a single emoji may need four tokens, and a Korean syllable may be "
        "cut in the middle of its bytes. The server must therefore hold back incomplete bytes "
        "until the next token completes them, and only then send text to the client."
    ),
    (
        "Small models are useful for tests because they load in a moment and behave the same way "
        "on every machine. Random weights would produce noise, so this model is arranged to "
        "repeat a known passage, which makes every streamed chunk easy to check. The passage "
        "mixes English with Korean, Chinese, Japanese, Russian, German and Hindi, and it carries "
        "emoji with skin tones, joined emoji sequences and letters with combining accents."
    ),
    (
        "During prefill the model reads the whole prompt at once and fills its key and value "
        "cache. During decoding it reads one new token per step, attends to everything cached "
        "so far, and writes one more entry. Greedy decoding always takes the most likely token; "
        "sampling draws from the distribution, shaped by temperature, top-k and top-p, so a "
        "fixed seed is needed to repeat a result."
    ),
    (
        "When a client disconnects, the request is cancelled and its slot is freed for the next "
        "one. When the queue is full, new requests wait or are rejected with a clear error. "
        "Metrics count prompt tokens, generated tokens, time to first token and tokens per "
        "second, and the health endpoint reports whether the model has finished loading."
    ),
    (
        "def stream_text(model, prompt, max_new_tokens=16):\n"
        '    """Yield decoded text pieces as the model produces them."""\n'
        '    pending = b""\n'
        "    for token_id in model.generate(prompt, max_new_tokens=max_new_tokens):\n"
        "        pending += model.token_bytes(token_id)\n"
        "        try:\n"
        '            text = pending.decode("utf-8")\n'
        "        except UnicodeDecodeError:\n"
        "            continue\n"
        '        pending = b""\n'
        "        yield text\n"
    ),
    (
        "class Request:\n"
        "    def __init__(self, prompt: str, temperature: float = 1.0) -> None:\n"
        "        self.prompt = prompt\n"
        "        self.temperature = temperature\n"
        "        self.tokens: list[int] = []\n\n"
        "    def is_finished(self, eos_ids: set[int], limit: int) -> bool:\n"
        "        return len(self.tokens) >= limit or bool(self.tokens and self.tokens[-1] in eos_ids)\n"
    ),
    (
        'for i in range(10): print(i, i * i, {"index": i, "square": i ** 2})\n'
        'response = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": '
        '[{"index": 0, "delta": {"content": "Hello"}, "finish_reason": null}]}\n'
    ),
    (
        "Numbers and symbols: 3.14159, 2^10 = 1024, 100%, $42.00, [a, b], {key: value}, <tag/>, "
        "#1, @user, a -> b, x != y, (1 + 2) * 3 / 4."
    ),
)
_CORPUS_WORLD = (
    (
        "안녕하세요. 저는 작은 언어 모델입니다. 오늘은 날씨가 맑고 따뜻합니다. 우리는 함께 코드를 "
        "읽고 테스트를 작성합니다. 한국어 문장은 여러 바이트로 이루어진 글자를 사용합니다. "
        "서버는 토큰을 하나씩 보내고, 클라이언트는 글자가 완성될 때까지 기다립니다."
    ),
    (
        "你好，世界。我们今天学习中文。这个模型很小，但是它可以生成文字。每个汉字在UTF-8中占三个字节。"
        "服务器一次发送一个词元，客户端把它们拼成完整的句子。"
    ),
    (
        "こんにちは、世界。今日はいい天気ですね。日本語の文章にはひらがな、カタカナ、漢字が混ざっています。"
        "モデルは一つずつトークンを返します。"
    ),
    "Привет, мир! Это маленькая модель для тестов. Каждая буква кириллицы занимает два байта.",
    (
        "Grüße aus Köln! Der Server schickt jedes Wort sofort. Ça va très bien, merci. "
        "नमस्ते दुनिया, यह एक छोटा मॉडल है।"
    ),
    "Emoji: 👋 👋🏻 👋🏽 👋🏿 🧑\u200d💻 👩\u200d🔬 👨\u200d👩\u200d👧 ❤️ 🎉 🚀 ✨ 🙂 🌍 🇰🇷 🇯🇵 🇩🇪",
    (
        "Combining marks: cafe\u0301 and café, nai\u0308ve and naïve, Ame\u0301lie, "
        "re\u0301sume\u0301, n\u0303 and a\u030a, €9.99."
    ),
)

CHAT_TEMPLATE = (
    "{{- bos_token }}\n"
    "{%- for message in messages %}\n"
    "    {%- if message['content'] is string %}\n"
    "        {%- set content = message['content'] %}\n"
    "    {%- else %}\n"
    "        {%- set content = message['content'] | selectattr('type', 'equalto', 'text')"
    " | map(attribute='text') | join('') %}\n"
    "    {%- endif %}\n"
    "    {{- '" + START_HEADER_TOKEN + "' + message['role'] + '" + END_HEADER_TOKEN + "\\n\\n' }}\n"
    "    {{- content | trim + '" + EOT_TOKEN + "' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '" + START_HEADER_TOKEN + "assistant" + END_HEADER_TOKEN + "\\n\\n' }}\n"
    "{%- endif %}\n"
)


# --- tokenizer -------------------------------------------------------------------------------

# Far above what the corpus supports (about 1.6k): the vocabulary is every merge seen twice.
_VOCAB_LIMIT = 8192


def train_tokenizer() -> Tokenizer:
    """Train the demo byte-level BPE tokenizer; every byte is a token, merges stay modest."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_VOCAB_LIMIT,
        min_frequency=2,  # pairs seen once stay split: rare CJK characters keep their bytes apart
        show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    # DEMO_TEXT twice: its pieces must become tokens, the cycle spells repeated letters many ways.
    corpus = [*_CORPUS_LATIN * 2, *_CORPUS_WORLD, DEMO_TEXT, DEMO_TEXT]
    tokenizer.train_from_iterator(corpus, trainer)
    if [tokenizer.token_to_id(token) for token in SPECIAL_TOKENS] != list(range(len(SPECIAL_TOKENS))):
        raise RuntimeError("the BPE trainer did not give the special tokens the first ids")
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A {BOS_TOKEN}:1 $B:1",
        special_tokens=[(BOS_TOKEN, BOS_TOKEN_ID)],
    )
    return tokenizer


def _byte_of_symbol() -> dict[str, int]:
    """Invert the ByteLevel alphabet: printable bytes stand for themselves, the rest shift up."""
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    shifted = (b for b in range(256) if b not in printable)
    symbols = {chr(b): b for b in printable}
    symbols.update({chr(0x100 + rank): b for rank, b in enumerate(shifted)})
    return symbols


def token_bytes(tokenizer: Tokenizer) -> dict[int, bytes]:
    """Map every non-special token id to the raw bytes it stands for."""
    byte_of = _byte_of_symbol()
    return {
        token_id: bytes(byte_of[symbol] for symbol in token)
        for token, token_id in tokenizer.get_vocab().items()
        if token not in SPECIAL_TOKENS
    }


# --- the cycle: DEMO_TEXT spelled with distinct token ids --------------------------------------
#
# Each word occurrence takes the cheapest spelling whose tokens no earlier word has taken. Words
# with the fewest usable tokens (punctuation, short common words) go first; a word left with no
# spelling moves to the front of the order and spelling starts over ("squeaky wheel"), which
# settles the few real conflicts (a repeated short word, a shared byte) in a handful of rounds.

# Runners-up kept per suffix, for words whose cheapest spelling would repeat a token.
_SPELLINGS_PER_SUFFIX = 6
_MAX_ROUNDS = 200
# Extra cost of a whole multibyte character inside one token: the cycle prefers tokens that cut
# characters, which is what UTF-8-safe streaming must be tested on.
_WHOLE_CHARACTER_COST = 4


def _whole_multibyte_chars(piece: bytes) -> int:
    """How many complete non-ASCII characters `piece` holds (an unsplit character counts)."""
    text = piece.decode("utf-8", errors="replace")
    return sum(1 for char in text if ord(char) > 0x7F and char != "\ufffd")


def _piece_cost(piece: bytes) -> int:
    """Cost of spelling with `piece`: one per token, more for each character it leaves whole."""
    return 1 + _WHOLE_CHARACTER_COST * _whole_multibyte_chars(piece)


def _words(tokenizer: Tokenizer, text: str) -> list[bytes]:
    """Split `text` the way the tokenizer's pre-tokenizer does, as raw bytes."""
    assert tokenizer.pre_tokenizer is not None
    return [text[a:b].encode() for _, (a, b) in tokenizer.pre_tokenizer.pre_tokenize_str(text)]


class _Speller:
    """Cheapest spellings of words as distinct tokens, avoiding tokens already taken."""

    def __init__(self, ids_of: dict[bytes, int]) -> None:
        self.ids_of = ids_of
        self.cost = {token_id: _piece_cost(piece) for piece, token_id in ids_of.items()}
        self.longest = max(map(len, ids_of))

    def _spans(self, word: bytes, start: int) -> range:
        return range(start + 1, min(len(word), start + self.longest) + 1)

    def usable_tokens(self, word: bytes) -> int:
        """How many distinct tokens occur in `word`: few means it must choose early."""
        pieces = (word[start:end] for start in range(len(word)) for end in self._spans(word, start))
        return len({self.ids_of[piece] for piece in pieces if piece in self.ids_of})

    def spell(self, word: bytes, taken: set[int]) -> tuple[int, ...] | None:
        """The cheapest spelling of `word` with no token twice and none from `taken` (k-best DP)."""
        best: list[list[tuple[int, tuple[int, ...]]]] = [[] for _ in word] + [[(0, ())]]
        for start in range(len(word) - 1, -1, -1):
            options = []
            for end in self._spans(word, start):
                token_id = self.ids_of.get(word[start:end])
                if token_id is None or token_id in taken:
                    continue
                cost = self.cost[token_id]
                options += [(cost + c, (token_id, *rest)) for c, rest in best[end] if token_id not in rest]
            best[start] = sorted(options)[:_SPELLINGS_PER_SUFFIX]
        return best[0][0][1] if best[0] else None


def _spell_in_order(
    speller: _Speller, words: Sequence[bytes], order: Sequence[int]
) -> list[tuple[int, ...]] | int:
    """Spell the words in `order`: their spellings in text order, or the index of one that failed."""
    taken: set[int] = set()
    chosen: dict[int, tuple[int, ...]] = {}
    for index in order:
        spelling = speller.spell(words[index], taken)
        if spelling is None:
            return index
        chosen[index] = spelling
        taken.update(spelling)
    return [chosen[index] for index in range(len(words))]


def _spell_distinct(words: Sequence[bytes], ids_of: dict[bytes, int]) -> list[int]:
    """Token ids, all distinct, whose bytes concatenate to those of `words`."""
    speller = _Speller(ids_of)
    order = sorted(range(len(words)), key=lambda index: (speller.usable_tokens(words[index]), index))
    for _ in range(_MAX_ROUNDS):
        result = _spell_in_order(speller, words, order)
        if not isinstance(result, int):
            return [token_id for spelling in result for token_id in spelling]
        order.remove(result)
        order.insert(0, result)
    raise RuntimeError(f"DEMO_TEXT cannot be spelled with distinct tokens; stuck at {words[order[0]]!r}")


def _chat_prompt_end_ids(tokenizer: Tokenizer) -> set[int]:
    """Ids a chat prompt ends with; in the cycle, one would make greedy output start mid-cycle."""
    return set(tokenizer.encode(f"{END_HEADER_TOKEN}\n\n", add_special_tokens=False).ids)


def demo_cycle(tokenizer: Tokenizer) -> list[int]:
    """Distinct token ids that decode to DEMO_TEXT; greedy decoding walks them in a loop."""
    banned = _chat_prompt_end_ids(tokenizer)
    pieces = token_bytes(tokenizer)
    ids_of = {piece: token_id for token_id, piece in pieces.items() if token_id not in banned}
    return _spell_distinct(_words(tokenizer, DEMO_TEXT), ids_of)


# --- weights ---------------------------------------------------------------------------------
#
# The final hidden state is RMS-normalised, so only its direction reaches the logits. Every
# token embedding is a unit direction e_t, scaled to a norm the layers barely disturb:
#   e_t = BIAS_SHARE * axis0 + sqrt(1 - BIAS_SHARE**2) * f_t,   f_t a unit vector off axis 0.
# For cycle tokens but the last, f_t is random and off axis 1 as well; every other token (a
# "restart feeder") leans on axis 1 by RESTART_SHARE. The lm_head row of c_{i+1} is f_{c_i}, so
# c_i leads to c_{i+1}; the row of c_0 is axis 1, so every feeder leads to c_0; the rows of the
# special tokens point against axis 0, which every embedding shares, so they are never chosen,
# not even by sampling (EOS never ends a benchmark early). Rows no token leads to are random.

_BIAS_AXIS = 0
_RESTART_AXIS = 1
_BIAS_SHARE = 0.3
_RESTART_SHARE = 0.7
_EMBEDDING_RMS = 1.0
# Aimed-at ratio of all layers' residual updates to the embedding (attention averaging roughly
# halves it): enough to move the logits with the context, never enough to move the argmax.
_RESIDUAL_SHARE = 0.5
# Mean probability of the next cycle token at temperature 1: sampling must still wander.
_TARGET_TOP_PROBABILITY = 0.7
# Least lead of succ(t) over any other token, as a fraction of the logit scale, for every t.
_MIN_MARGIN = 0.2
_SPECIAL_IDS = list(range(len(SPECIAL_TOKENS)))


def _free_directions(rng: np.random.Generator, rows: int, dim: int) -> np.ndarray:
    """Random unit rows with nothing on the bias and restart axes."""
    directions = rng.standard_normal((rows, dim), dtype=np.float32)
    directions[:, [_BIAS_AXIS, _RESTART_AXIS]] = 0.0
    return directions / np.linalg.norm(directions, axis=1, keepdims=True)


def _free_parts(rng: np.random.Generator, dim: int, vocab_size: int, cycle: Sequence[int]) -> np.ndarray:
    """The f_t of every token: random for the cycle, leaning on the restart axis for feeders."""
    free = _free_directions(rng, vocab_size, dim)
    feeders = np.ones(vocab_size, dtype=bool)
    feeders[list(cycle[:-1])] = False
    free[feeders] *= np.float32(np.sqrt(1.0 - _RESTART_SHARE**2))
    free[feeders, _RESTART_AXIS] = _RESTART_SHARE
    return free


def _token_directions(free: np.ndarray) -> np.ndarray:
    """Unit embedding directions e_t: a fixed share on the bias axis plus the free part."""
    directions = free * np.float32(np.sqrt(1.0 - _BIAS_SHARE**2))
    directions[:, _BIAS_AXIS] = _BIAS_SHARE
    return directions


def _unit_lm_head(rng: np.random.Generator, free: np.ndarray, cycle: Sequence[int]) -> np.ndarray:
    """lm_head rows whose dot product with e_t is 1 for succ(t), -1 for specials, ~0 otherwise."""
    vocab_size, dim = free.shape
    unit = _free_directions(rng, vocab_size, dim)
    unit[list(cycle[1:])] = free[list(cycle[:-1])]
    unit[cycle[0]] = 0.0
    unit[cycle[0], _RESTART_AXIS] = 1.0 / _RESTART_SHARE
    unit /= np.float32(np.sqrt(1.0 - _BIAS_SHARE**2))
    unit[_SPECIAL_IDS] = 0.0
    unit[_SPECIAL_IDS, _BIAS_AXIS] = -1.0 / _BIAS_SHARE
    return unit


def _successors(vocab_size: int, cycle: Sequence[int]) -> np.ndarray:
    """The token greedy decoding must pick after each token: c_{i+1} after c_i, else c_0."""
    successors = np.full(vocab_size, cycle[0])
    successors[list(cycle[:-1])] = cycle[1:]
    return successors


def _check_margin(scores: np.ndarray, successors: np.ndarray) -> None:
    """Fail the build unless every token's successor leads all other tokens clearly."""
    rows = np.arange(len(successors))
    intended = scores[rows, successors]
    scores[rows, successors] = -np.inf
    if np.min(intended - scores.max(axis=1)) < _MIN_MARGIN:
        raise RuntimeError("this seed gives a demo model whose greedy walk may stray; try another")


def _mean_successor_probability(logits: np.ndarray, successors: np.ndarray) -> float:
    """Mean softmax probability of each row's successor."""
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    intended = weights[np.arange(len(successors)), successors]
    return float(np.mean(intended / weights.sum(axis=1)))


def _logit_scale(scores: np.ndarray, successors: np.ndarray) -> float:
    """The logit scale at which the next cycle token has the target mean probability."""
    low, high = 0.0, 64.0
    for _ in range(40):
        middle = (low + high) / 2
        if _mean_successor_probability(middle * scores, successors) < _TARGET_TOP_PROBABILITY:
            low = middle
        else:
            high = middle
    # Rounded, so that float noise in the matmul cannot change the bytes written.
    return round(high, 2)


def _token_weights(
    rng: np.random.Generator, dim: int, vocab_size: int, cycle: Sequence[int]
) -> dict[str, np.ndarray]:
    """Embedding and lm_head matrices that make greedy decoding walk `cycle`."""
    free = _free_parts(rng, dim, vocab_size, cycle)
    directions = _token_directions(free)
    unit_head = _unit_lm_head(rng, free, cycle)
    successors = _successors(vocab_size, cycle)
    scale = _logit_scale(directions[list(cycle)] @ unit_head.T, successors[list(cycle)])
    _check_margin(directions @ unit_head.T, successors)
    return {
        "model.embed_tokens.weight": directions * np.float32(_EMBEDDING_RMS * np.sqrt(dim)),
        # The final RMSNorm brings the hidden state to norm sqrt(dim); the lm_head undoes that.
        "lm_head.weight": unit_head * np.float32(scale / np.sqrt(dim)),
        "model.norm.weight": np.ones(dim, dtype=np.float32),
    }


def _gaussian(rng: np.random.Generator, shape: tuple[int, int], gain: float) -> np.ndarray:
    """A random projection whose output has `gain` times the RMS of its input."""
    weight = rng.standard_normal(shape, dtype=np.float32)
    weight *= np.float32(gain / np.sqrt(shape[1]))
    return weight


def _layer_gain(num_layers: int) -> float:
    """Gain of the value, output and MLP projections: a sublayer adds about gain**2 RMS."""
    # The updates of 2 * num_layers sublayers add up like a random walk.
    return float(np.sqrt(_RESIDUAL_SHARE * _EMBEDDING_RMS / np.sqrt(2 * num_layers)))


def _layer_weights(rng: np.random.Generator, size: DemoModelSize, layer: int) -> dict[str, np.ndarray]:
    """Random attention and MLP weights of one decoder layer, small next to the embeddings."""
    d, gain = size.hidden_size, _layer_gain(size.num_layers)
    q_width, kv_width = size.num_heads * size.head_dim, size.num_kv_heads * size.head_dim
    prefix = f"model.layers.{layer}"
    return {
        # Queries and keys at full gain, so attention really depends on the content.
        f"{prefix}.self_attn.q_proj.weight": _gaussian(rng, (q_width, d), 1.0),
        f"{prefix}.self_attn.k_proj.weight": _gaussian(rng, (kv_width, d), 1.0),
        f"{prefix}.self_attn.v_proj.weight": _gaussian(rng, (kv_width, d), gain),
        f"{prefix}.self_attn.o_proj.weight": _gaussian(rng, (d, q_width), gain),
        f"{prefix}.mlp.gate_proj.weight": _gaussian(rng, (size.intermediate_size, d), gain),
        f"{prefix}.mlp.up_proj.weight": _gaussian(rng, (size.intermediate_size, d), gain),
        f"{prefix}.mlp.down_proj.weight": _gaussian(rng, (d, size.intermediate_size), gain),
        f"{prefix}.input_layernorm.weight": np.ones(d, dtype=np.float32),
        f"{prefix}.post_attention_layernorm.weight": np.ones(d, dtype=np.float32),
    }


def demo_weights(
    size: DemoModelSize, vocab_size: int, cycle: Sequence[int], seed: int
) -> dict[str, np.ndarray]:
    """All tensors of the demo model, by their LlamaForCausalLM names."""
    rng = np.random.default_rng(seed)
    tensors = _token_weights(rng, size.hidden_size, vocab_size, cycle)
    for layer in range(size.num_layers):
        tensors.update(_layer_weights(rng, size, layer))
    return tensors


# --- files -----------------------------------------------------------------------------------


def _write_json(path: Path, document: dict[str, Any]) -> None:
    """Write JSON with a fixed key order and layout, so equal documents give equal bytes."""
    path.write_text(json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n", "utf-8")


def model_config(size: DemoModelSize, vocab_size: int) -> dict[str, Any]:
    """The config.json of a LlamaForCausalLM of this size."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": size.hidden_size,
        "intermediate_size": size.intermediate_size,
        "num_hidden_layers": size.num_layers,
        "num_attention_heads": size.num_heads,
        "num_key_value_heads": size.num_kv_heads,
        "head_dim": size.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "rms_norm_eps": RMS_NORM_EPS,
        "rope_theta": ROPE_THETA,
        "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": BOS_TOKEN_ID,
        "eos_token_id": list(EOS_TOKEN_IDS),
        "pad_token_id": END_OF_TEXT_TOKEN_ID,
        "dtype": "float32",
    }


def generation_config() -> dict[str, Any]:
    """The generation_config.json: stop at the end of a turn or of the text."""
    return {
        "bos_token_id": BOS_TOKEN_ID,
        "eos_token_id": list(EOS_TOKEN_IDS),
        "pad_token_id": END_OF_TEXT_TOKEN_ID,
    }


def tokenizer_config() -> dict[str, Any]:
    """The tokenizer_config.json; the chat template lives beside it in chat_template.jinja."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOT_TOKEN,
        "pad_token": END_OF_TEXT_TOKEN,
        "model_max_length": MAX_POSITION_EMBEDDINGS,
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "attention_mask"],
    }


def _write_tokenizer(directory: Path, tokenizer: Tokenizer) -> None:
    """Write tokenizer.json, tokenizer_config.json and chat_template.jinja."""
    (directory / "tokenizer.json").write_text(tokenizer.to_str(pretty=True) + "\n", "utf-8")
    _write_json(directory / "tokenizer_config.json", tokenizer_config())
    (directory / "chat_template.jinja").write_text(CHAT_TEMPLATE, "utf-8")


def _manifest(size_name: str, seed: int, cycle: Sequence[int]) -> dict[str, Any]:
    """What was built, for `read_demo_cycle` and for spotting a complete directory."""
    return {"size": size_name, "seed": seed, "cycle_ids": list(cycle), "text": DEMO_TEXT}


# --- public entry points -----------------------------------------------------------------------

DEMO_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    MANIFEST_FILE,
)


def _size(name: str) -> DemoModelSize:
    """The shape called `name`, or a ValueError that lists the known ones."""
    if name not in SIZES:
        raise ValueError(f"unknown demo model size {name!r}; choose one of {', '.join(SIZES)}")
    return SIZES[name]


def build_demo_model(directory: Path, size: str = "tiny", seed: int = 0) -> Path:
    """Write the demo model of `size` into `directory` (created if missing); return `directory`.

    The same size and seed always give byte-identical files. The manifest is written last, so a
    directory that has it is complete.
    """
    shape = _size(size)
    tokenizer = train_tokenizer()
    cycle = demo_cycle(tokenizer)
    vocab_size = tokenizer.get_vocab_size()
    tensors = demo_weights(shape, vocab_size, cycle, seed)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / MANIFEST_FILE).unlink(missing_ok=True)  # an old build's marker must not vouch for this one
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    _write_json(directory / "config.json", model_config(shape, vocab_size))
    _write_json(directory / "generation_config.json", generation_config())
    _write_tokenizer(directory, tokenizer)
    _write_json(directory / MANIFEST_FILE, _manifest(size, seed, cycle))
    return directory


def is_complete_demo_model(directory: Path) -> bool:
    """True if `directory` holds every file a finished `build_demo_model` writes."""
    return all((directory / name).is_file() for name in DEMO_FILES)


def read_demo_cycle(directory: Path) -> list[int]:
    """The token ids greedy decoding walks, as recorded by `build_demo_model`."""
    manifest = json.loads((directory / MANIFEST_FILE).read_text("utf-8"))
    return [int(token_id) for token_id in manifest["cycle_ids"]]


def greedy_walk(cycle: Sequence[int], last_prompt_id: int, count: int) -> list[int]:
    """The `count` ids greedy decoding yields after a prompt that ends with `last_prompt_id`."""
    start = cycle.index(last_prompt_id) + 1 if last_prompt_id in cycle else 0
    return [cycle[(start + step) % len(cycle)] for step in range(count)]


def default_demo_model_dir(size: str = "small") -> Path:
    """`$LLMD_HOME/demo-model-{size}`, or `~/.cache/llmd/demo-model-{size}` without LLMD_HOME."""
    home = os.environ.get("LLMD_HOME")
    root = Path(home) if home else Path.home() / ".cache" / "llmd"
    return root / f"demo-model-{size}"


def ensure_demo_model(size: str = "small") -> Path:
    """Return the default demo model directory of `size`, building it first if needed.

    The model is built in a temporary directory beside the target and renamed into place, so an
    interrupted build never leaves a directory that looks complete.
    """
    _size(size)
    target = default_demo_model_dir(size)
    if is_complete_demo_model(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        _install(build_demo_model(staging, size), target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _install(staging: Path, target: Path) -> None:
    """Rename a finished build to `target`; a complete one that another process put there wins."""
    if target.exists() and not is_complete_demo_model(target):
        _discard(target)
    try:
        os.replace(staging, target)
    except OSError:
        if not is_complete_demo_model(target):
            raise


def _discard(path: Path) -> None:
    """Remove an incomplete model directory, moving it aside first so no one reads it half gone."""
    graveyard = Path(tempfile.mkdtemp(prefix=f".{path.name}.stale.", dir=path.parent))
    try:
        os.replace(path, graveyard / path.name)
    finally:
        shutil.rmtree(graveyard, ignore_errors=True)
