"""End to end: `POST /v1/completions` (and llama.cpp's `/infill`) on a real `llmd serve`, through the
official `openai` SDK and raw httpx.

The shapes and refusals are tested around a fake engine in tests/api/test_api_completions.py;
here the real model answers, an editor-shaped request is cancelled, and server-side FIM runs
with a `fim_template` setting (the demo tokenizer has no FIM tokens of its own).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest

from llmd.demo.text import DEMO_TEXT
from llmd.engine.tokenizer import ChatTokenizer
from llmd.engine.types import ExtraFile, InfillInput
from tests.helpers.daemon import Daemon, start_daemon
from tests.helpers.waiting import wait_until

PROMPT = "The weather"
# The demo tokenizer's control tokens, written as text the way Continue writes a FIM template.
TEMPLATED = "<|start_header|>def add(a, b):\n    <|end_header|>\n\nprint(add(1, 2))<|eot|>"
FIM_TEMPLATE = "<|start_header|>{prefix}<|end_header|>{suffix}<|eot|>"
# Continue's stop list for a Qwen coder model, and more: it sends a dozen and up.
STOPS = ["<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
         "<|repo_name|>", "<|file_sep|>", "<|im_start|>", "<|im_end|>", "\n\n\n", "/src/", "```"]


def client(daemon: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.base_url, api_key="unused", max_retries=0)


def on_the_cycle(text: str) -> bool:
    """Whether `text` is a stretch of where the demo model's greedy decoding goes (its text, cycled)."""
    return text.strip("\ufffd") in DEMO_TEXT * 3


def stats(daemon: Daemon) -> dict:
    return httpx.get(f"{daemon.url}/stats").json()


def wait_for(daemon: Daemon, predicate: Callable[[dict], bool]) -> dict:
    """The engine's /stats once `predicate` holds for them."""
    def matching() -> dict | None:
        current = stats(daemon)
        return current if predicate(current) else None

    found: dict | None = wait_until("matching the engine stats", matching)
    assert found is not None  # wait_until returns only a truthy value
    return found


def test_non_stream_and_stream_agree_and_have_the_openai_shape(daemon: Daemon) -> None:
    sdk = client(daemon)
    whole = sdk.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0)
    chunks = list(sdk.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0,
                                         stream=True, stream_options={"include_usage": True}))
    [choice] = whole.choices
    assert whole.object == "text_completion" and whole.id.startswith("cmpl-")
    assert choice.finish_reason == "length" and on_the_cycle(choice.text) and choice.text
    assert whole.usage is not None and whole.usage.completion_tokens == 12
    *pieces, last = chunks
    assert "".join(c.choices[0].text for c in pieces) == choice.text
    assert pieces[-1].choices[0].finish_reason == "length" and last.choices == []
    assert last.usage is not None and last.usage == whole.usage
    assert len({c.id for c in chunks}) == 1 and chunks[0].object == "text_completion"


def test_a_prompt_list_streams_one_indexed_choice_each(daemon: Daemon) -> None:
    chunks = list(client(daemon).completions.create(model="tiny", prompt=["The", "A storm", "Rain"],
                                                    max_tokens=6, temperature=0, stream=True))
    texts: dict[int, str] = {}
    for chunk in chunks:
        texts[chunk.choices[0].index] = texts.get(chunk.choices[0].index, "") + chunk.choices[0].text
    assert sorted(texts) == [0, 1, 2] and all(texts.values())
    assert sorted(c.choices[0].index for c in chunks if c.choices[0].finish_reason == "length") == [0, 1, 2]


def test_echo_and_token_id_prompts(daemon: Daemon) -> None:
    sdk = client(daemon)
    echoed = sdk.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, temperature=0, echo=True)
    assert echoed.choices[0].text.startswith(PROMPT) and len(echoed.choices[0].text) > len(PROMPT)
    ids = ChatTokenizer(daemon_model(daemon)).encode_text(PROMPT, literal=False)
    by_ids = sdk.completions.create(model="tiny", prompt=ids, max_tokens=4, temperature=0, echo=True)
    assert by_ids.choices[0].text.startswith(PROMPT) and by_ids.usage is not None
    assert by_ids.usage.prompt_tokens == len(ids)


def test_a_suffix_without_fim_tokens_is_a_400_naming_it(daemon: Daemon) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client(daemon).completions.create(model="tiny", prompt="def f(", suffix="\n", max_tokens=4)
    body = err.value.body
    assert isinstance(body, dict) and body["param"] == "suffix" and "FIM" in body["message"]


def test_an_editor_request_cancelled_after_three_chunks_frees_its_slot(daemon: Daemon) -> None:
    before = stats(daemon)
    body = {"model": "tiny", "prompt": TEMPLATED, "max_tokens": 4096, "temperature": 0.01, "stream": True,
            "stop": STOPS}
    events: list[dict] = []
    with httpx.Client(base_url=daemon.url, timeout=30) as http, \
            http.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line.removeprefix("data: ")))
            if len(events) == 3:
                break  # the next keystroke: close the connection
    assert all(e["object"] == "text_completion" for e in events)
    after = wait_for(daemon, lambda s: s["aborted"] == before["aborted"] + 1 and s["running"] == 0)
    assert after["finished"] == before["finished"]


def daemon_model(daemon: Daemon) -> Path:
    """The model directory the session daemon serves (from its command line)."""
    args = daemon.process.args
    assert isinstance(args, list)
    return Path(args[args.index("--model") + 1])


@pytest.fixture(scope="module")
def fim_daemon(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("fim")
    (tmp / "llmd.yaml").write_text(f"fim_template: '{FIM_TEMPLATE}'\n")
    daemon = start_daemon(tmp, "--model", str(tiny_model), "--served-model-name", "tiny",
                          "--config", str(tmp / "llmd.yaml"))
    yield daemon
    assert daemon.stop() == 0, daemon.log()


def test_server_side_fim_builds_the_configured_layout(fim_daemon: Daemon, tiny_model: Path) -> None:
    prefix, suffix = "def add(a, b):\n    ", "\n\nprint(add(1, 2))\n"
    expected = ChatTokenizer(tiny_model, fim_template=FIM_TEMPLATE).encode_completion(prefix, suffix).ids
    sdk = client(fim_daemon)
    result = sdk.completions.create(model="tiny", prompt=prefix, suffix=suffix, max_tokens=6, temperature=0)
    assert result.usage is not None and result.usage.prompt_tokens == len(expected)
    assert result.choices[0].finish_reason == "length" and result.choices[0].text
    templated = prefix.join(FIM_TEMPLATE.split("{prefix}")).replace("{suffix}", suffix)
    same = sdk.completions.create(model="tiny", prompt=templated, max_tokens=6, temperature=0)
    assert same.choices[0].text == result.choices[0].text  # the client-templated prompt is the same ids


# llama.vim's FIM request, field for field (autoload/llama.vim, llama#fim), and its ring-buffer
# update that only evaluates the chunks (s:ring_update).
VIM_PREFIX, VIM_SUFFIX = "def add(a, b):\n", "\n\nprint(add(1, 2))\n"
VIM_CHUNK = "def sub(a, b):\n    return a - b\n"
VIM_CHUNKS = [{"text": VIM_CHUNK, "time": [1733000000, 250], "filename": "util.py"}]
VIM_FIELDS = ["content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
              "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
              "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated", "tokens_cached"]
LLAMA_VIM = {"input_prefix": VIM_PREFIX, "input_suffix": VIM_SUFFIX, "input_extra": VIM_CHUNKS,
             "prompt": "    ", "n_predict": 256, "n_indent": 4, "top_k": 40, "top_p": 0.99, "stream": False,
             "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True, "t_max_prompt_ms": 500,
             "t_max_predict_ms": 1500, "response_fields": VIM_FIELDS}
VIM_RING = {"input_prefix": "", "input_suffix": "", "input_extra": VIM_CHUNKS, "prompt": "", "n_predict": 0,
            "temperature": 0.0, "stream": False, "samplers": [], "cache_prompt": True, "t_max_prompt_ms": 1,
            "t_max_predict_ms": 1, "response_fields": [""]}


def test_llama_vims_infill_requests_are_served(fim_daemon: Daemon, tiny_model: Path) -> None:
    infill = InfillInput(VIM_PREFIX + "    ", VIM_SUFFIX, (ExtraFile("util.py", VIM_CHUNK),))
    expected = ChatTokenizer(tiny_model, fim_template=FIM_TEMPLATE).encode_infill(infill).ids
    with httpx.Client(base_url=fim_daemon.url, timeout=60) as http:
        ring = http.post("/infill", json=VIM_RING)
        result = http.post("/infill", json=LLAMA_VIM)
    assert ring.status_code == 200 and ring.json() == {}
    assert result.status_code == 200, result.text
    body = result.json()
    assert set(body) == set(VIM_FIELDS) and isinstance(body["content"], str)
    assert body["timings/prompt_n"] == len(expected) and body["truncated"] is False
    assert 1 <= body["timings/predicted_n"] <= 256
    assert body["tokens_cached"] == body["timings/prompt_n"] + body["timings/predicted_n"]
    wait_for(fim_daemon, lambda s: s["running"] == 0)


def test_an_infill_stream_is_llama_cpps(fim_daemon: Daemon) -> None:
    body = LLAMA_VIM | {"stream": True, "n_predict": 8, "response_fields": None, "n_indent": 0}
    with httpx.Client(base_url=fim_daemon.url, timeout=60) as http:
        response = http.post("/infill", json=body)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = [line.removeprefix("data: ") for line in response.text.split("\n\n") if line]
    assert "[DONE]" not in events
    *pieces, last = [json.loads(e) for e in events]
    assert all(p["stop"] is False for p in pieces) and last["stop"] is True and last["content"] == ""
    assert last["tokens_predicted"] == last["timings"]["predicted_n"] <= 8
