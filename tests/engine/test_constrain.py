"""`EngineClient.constrain` on the tiny model: the vocabulary view built once, validated grammars
cached, and a schema that cannot compile in time refused naming its field."""

from __future__ import annotations

from pathlib import Path

import pytest

import llmd.engine.prompts as prompts_module
from llmd.engine.client import EngineClient
from llmd.engine.types import ANY_OBJECT, GrammarRequest
from llmd.engine.worker import EngineWorker
from llmd.errors import InvalidRequest
from tests.helpers.engine import run_with_engine

REQUEST = GrammarRequest(ANY_OBJECT, "response_format")


def test_grammars_share_one_vocabulary_view_and_a_cache(tiny_model: Path) -> None:
    async def body(engine: EngineClient, worker: EngineWorker) -> None:
        first, second = await engine.constrain(REQUEST), await engine.constrain(REQUEST)
        assert first.tokenizer is second.tokenizer and first.compiled is second.compiled  # type: ignore[attr-defined]

    run_with_engine(tiny_model, body)


def test_a_schema_that_does_not_compile_in_time_is_a_400(tiny_model: Path, monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    async def body(engine: EngineClient, worker: EngineWorker) -> None:
        monkeypatch.setattr(prompts_module, "GRAMMAR_SECONDS", 0.0)  # nothing compiles in no time
        with pytest.raises(InvalidRequest, match="did not compile within") as caught:
            await engine.constrain(REQUEST)
        assert caught.value.param == "response_format"

    run_with_engine(tiny_model, body)
