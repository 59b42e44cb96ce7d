"""The demo tokenizer: its special tokens, the byte-level BPE training, the Llama-3 style chat template."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from llmd.demo.text import tokenizer_corpus

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
    tokenizer.train_from_iterator(tokenizer_corpus(), trainer)
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
