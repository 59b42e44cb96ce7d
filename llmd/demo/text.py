"""The text the demo model speaks (`DEMO_TEXT`) and the corpus its tokenizer learns from.

Greedy decoding walks `DEMO_TEXT` in a loop: an English lead of whole-ASCII tokens, then a
multilingual rest whose characters split across tokens. The corpus decides which byte pairs
merge into tokens, and so how the text splits.
"""

from __future__ import annotations

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


def tokenizer_corpus() -> list[str]:
    """The texts the demo tokenizer is trained on, in training order."""
    # DEMO_TEXT twice: its pieces must become tokens, the cycle spells repeated letters many ways.
    return [*_CORPUS_LATIN * 2, *_CORPUS_WORLD, DEMO_TEXT, DEMO_TEXT]
