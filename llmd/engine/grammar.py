"""Grammars for constrained decoding: a request's JSON schema as a validated llguidance grammar.

Why llguidance (measured with scripts/grammar_bench.py on this CPU, a 131k-id vocabulary, 8 rows):
a schema reaches its first mask in 0.5-1 ms (xgrammar's compile took 15-22 ms, a stall for the
first request), the per-step mask fill ties (~0.1 ms for 8 rows), the wheel needs no other
package (xgrammar pulls triton and tvm-ffi), and it refuses by name the schema keywords it cannot
enforce (`not`, `if`/`then`, `uniqueItems`, `contains`, ...) where xgrammar accepts them silently.

Compiling happens before admission, off the event loop and never on the worker thread
(`GrammarCompiler.compile` is synchronous: the client runs it in a thread, with a timeout);
validated grammars are kept in a cache bounded in bytes, keyed by their schema text. Torch-free:
the model side turns a request's matcher into a mask over its row of logits.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from llguidance import LLMatcher

from llmd.engine.types import GrammarRequest
from llmd.errors import InvalidRequest, UnsupportedParameter

UNIMPLEMENTED = re.compile(r"Unimplemented keys: (\[.*?\])")
DEFAULT_CACHE_BYTES = 64 << 20
GRAMMAR_THREADS = 2  # grammar compiles at once, beside the event loop and the worker
# What the cache counts for a grammar's built start matcher (its lexer and parser state).
MATCHER_BYTES = 16 << 10
# JSON as `json.dumps` writes it (", " and ": "), no other whitespace: what models are trained to
# write, and no room to run on in whitespace until max_tokens (flexible whitespace allows that).
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True, slots=True)
class CompiledGrammar:
    """A validated grammar: `matcher` gives each request its own state over it.

    `start` is a matcher at the grammar's start over the compiler's vocabulary, built once off
    the worker thread: a request's matcher is a copy of it (~0.01 ms against ~0.6 ms for a new
    one, which the worker would pay as each constrained request joins).
    """

    grammar: str
    start: LLMatcher | None = field(default=None, compare=False)

    @property
    def size(self) -> int:
        """Bytes the cache counts for it (a built matcher at an estimate)."""
        return len(self.grammar) + (MATCHER_BYTES if self.start is not None else 0)

    def matcher(self, tokenizer: Any) -> LLMatcher:
        """A fresh matcher at the grammar's start, over the llguidance view of the vocabulary."""
        if self.start is not None:
            return self.start.deep_copy()
        return LLMatcher(tokenizer, self.grammar, log_level=0)


def refusal(message: str, param: str) -> InvalidRequest:
    """llguidance's reason a schema cannot be followed, as the 400 naming the request field.

    Keywords it does not implement would otherwise be dropped silently and the output not follow
    the schema: those are named as unsupported.
    """
    unimplemented = UNIMPLEMENTED.search(message)
    if unimplemented is not None:
        keys = ", ".join(f"`{key}`" for key in json.loads(unimplemented[1]))
        return UnsupportedParameter(f"`{param}` uses JSON Schema keywords llmd cannot enforce while "
                                    f"generating: {keys}", param=param)
    return InvalidRequest(f"`{param}` is not a JSON schema llmd can follow: {message}", param=param)


def validated(request: GrammarRequest, tokenizer: Any = None) -> CompiledGrammar:
    """The schema's (or Lark text's) grammar, checked (against the vocabulary when `tokenizer` is given).

    Raises `InvalidRequest` (or `UnsupportedParameter` for a keyword) naming `request.param`.
    """
    try:
        if request.lark:
            grammar = LLMatcher.grammar_from_lark(request.schema)
        else:
            grammar = LLMatcher.grammar_from_json_schema(request.schema, defaults=JSON_LAYOUT)  # type: ignore[arg-type]
    except (ValueError, TypeError) as exc:
        raise refusal(str(exc), request.param) from None
    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
    if is_error:
        raise refusal(messages[0] if messages else "invalid grammar", request.param)
    return CompiledGrammar(grammar)


@dataclass(frozen=True, slots=True)
class BoundGrammar:
    """A validated grammar over one vocabulary: the `Constraint` a request's sampling follows."""

    compiled: CompiledGrammar
    tokenizer: Any  # llguidance's view of the vocabulary, sized to the model's logits

    @property
    def grammar(self) -> str:
        """The validated grammar's text (llguidance's serialized form)."""
        return self.compiled.grammar

    def matcher(self) -> LLMatcher:
        """A fresh matcher at the grammar's start."""
        return self.compiled.matcher(self.tokenizer)


class GrammarCache:
    """Validated grammars by schema text; beyond `max_bytes` the least recently used go first."""

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = self.misses = 0
        self._entries: OrderedDict[str, CompiledGrammar] = OrderedDict()

    def get(self, schema: str) -> CompiledGrammar | None:
        """The cached grammar of `schema` (now the most recently used), or None."""
        compiled = self._entries.get(schema)
        if compiled is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(schema)
        return compiled

    def put(self, schema: str, compiled: CompiledGrammar) -> None:
        """Keep `compiled`, evicting the oldest beyond the budget; one larger than it is not kept."""
        cost = len(schema) + compiled.size
        if cost > self.max_bytes or schema in self._entries:
            return
        self._entries[schema] = compiled
        self.bytes += cost
        while self.bytes > self.max_bytes:
            old_schema, old = self._entries.popitem(last=False)
            self.bytes -= len(old_schema) + old.size


class GrammarCompiler:
    """Validates requests' schemas against one vocabulary, remembering what it validated."""

    def __init__(self, tokenizer: Any, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.tokenizer = tokenizer  # llguidance's view of the vocabulary (`llguidance.hf.from_tokenizer`)
        self.cache = GrammarCache(max_bytes)

    def compile(self, request: GrammarRequest) -> CompiledGrammar:
        """The request's grammar, from the cache or validated now (synchronous: run it in a thread)."""
        compiled = self.cache.get(request.schema)
        if compiled is None:
            compiled = self.build(request)
            self.cache.put(request.schema, compiled)
        return compiled

    def build(self, request: GrammarRequest) -> CompiledGrammar:
        """The request's grammar validated now, with its start matcher; the cache is not touched."""
        grammar = validated(request, self.tokenizer).grammar
        start = LLMatcher(self.tokenizer, grammar, log_level=0) if self.tokenizer is not None else None
        return CompiledGrammar(grammar, start)

    def cached(self, request: GrammarRequest) -> CompiledGrammar | None:
        """The request's grammar if it is cached (cheap: callable on the event loop)."""
        return self.cache.get(request.schema)


class SharedGrammars:
    """A `GrammarCompiler` shared by the event loop and compile threads.

    The lock guards only the cache and the one-time build of the vocabulary view (by
    `make_view`): validating runs outside it, so a slow schema (a hostile one takes seconds)
    delays only its own request, never a cached grammar or another compile.
    """

    def __init__(self, make_view: Callable[[], Any], max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self._make_view = make_view
        self._max_bytes = max_bytes
        self._compiler: GrammarCompiler | None = None
        self._lock = threading.Lock()
        # Compiles (never cancelled once begun) queue in their own threads, not where prompts are encoded.
        self._pool = ThreadPoolExecutor(GRAMMAR_THREADS, thread_name_prefix="llmd-grammar")

    async def bound(self, request: GrammarRequest, seconds: float) -> BoundGrammar:
        """The request's grammar: a cached one at once, else compiled in the pool within `seconds`
        (a 400 naming `request.param` after that)."""
        cached = self.cached(request)
        if cached is not None:
            return cached
        compiling = asyncio.get_running_loop().run_in_executor(self._pool, self.compile, request)
        try:
            return await asyncio.wait_for(compiling, seconds)
        except TimeoutError:
            raise InvalidRequest(f"`{request.param}` did not compile within {seconds:g} s; simplify the "
                                 "schema", param=request.param) from None

    def close(self) -> None:
        """Drop queued compiles (one running finishes in its thread)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def cached(self, request: GrammarRequest) -> BoundGrammar | None:
        """The request's grammar if cached; None also while the view is being built (never blocks)."""
        if self._compiler is None or not self._lock.acquire(blocking=False):
            return None
        try:
            compiled = self._compiler.cached(request)
            return None if compiled is None else BoundGrammar(compiled, self._compiler.tokenizer)
        finally:
            self._lock.release()

    def compile(self, request: GrammarRequest) -> BoundGrammar:
        """The request's grammar, compiled now if need be (synchronous: run it in a thread)."""
        with self._lock:
            if self._compiler is None:
                self._compiler = GrammarCompiler(self._make_view(), self._max_bytes)
            compiler = self._compiler
            compiled = compiler.cached(request)
        if compiled is None:
            compiled = compiler.build(request)
            with self._lock:
                compiler.cache.put(request.schema, compiled)
        return BoundGrammar(compiled, compiler.tokenizer)
