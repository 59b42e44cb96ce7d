"""`POST /v1/responses`: read the input (and the stored conversation it continues), run it as a
chat, stream or return the response, store it.

The response runs on the chat path (`api/chat.py`'s `prepared`: template, tools, grammar, reply
reading), so both endpoints generate the same tokens for the same conversation. A stored
response is saved before its last event is sent: a client may continue from it at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import msgspec
from litestar import Request, post
from litestar import Response as HttpResponse
from litestar.response import Stream

from llmd.api.chat import CompletionMeta, check_model, prepared, reply_deltas
from llmd.api.choices import unless_disconnected
from llmd.api.dependencies import InjectedEngine, InjectedMetrics, InjectedModel, InjectedStore
from llmd.api.responses.as_chat import chat_request, responses_params
from llmd.api.responses.events import ResponseEvents, new_id
from llmd.api.responses.inputs import chat_messages, check_call_outputs, parse_items, stored_item
from llmd.api.responses.request import function_tools, parse_request, tool_choice
from llmd.api.responses.store import ResponseStore, StoredResponse
from llmd.api.sse import NAMED_EVENTS, pushed_sse_response
from llmd.engine.client import Engine, TokenStream
from llmd.engine.types import SamplingParams, TokenEvent
from llmd.errors import InvalidRequest, LlmdError
from llmd.response_events import StreamEvent
from llmd.response_object import (
    InputTokensDetails,
    OutputTokensDetails,
    ReasoningEcho,
    Response,
    ResponseUsage,
    TextEcho,
)
from llmd.responses_protocol import InputItem, ResponsesRequest, TextFormatText, TextOptions

_encoder = msgspec.json.Encoder()


@dataclass(slots=True)
class ResponsePlan:
    """A response ready to run: its prompt and sampling, how its reply is read, its events, and
    what is stored of it (None when it is not stored)."""

    prompt_ids: list[int]
    params: SamplingParams
    meta: CompletionMeta
    events: ResponseEvents
    stored_input: list[dict[str, object]] | None


@post("/v1/responses", status_code=200)
async def create_response(request: Request, engine: InjectedEngine, metrics: InjectedMetrics,
                          served: InjectedModel, responses: InjectedStore) -> HttpResponse[Response] | Stream:
    """Generate one response, streamed as named SSE events when `stream` is true."""
    body = parse_request(await request.body())
    check_model(body.model, served.id)
    plan = await planned(engine, responses, body)
    stream = engine.submit(plan.prompt_ids, plan.params)
    events = ResponseChunks(stream, plan, responses)
    if body.stream:
        return pushed_sse_response(request, [stream], events, metrics.observe_error, NAMED_EVENTS)
    await unless_disconnected(request, completed(stream, events))
    return HttpResponse(plan.events.response)


async def planned(engine: Engine, store: ResponseStore | None, body: ResponsesRequest) -> ResponsePlan:
    """Everything the response needs before it is submitted; every refusal is raised here."""
    tools, choice = function_tools(body.tools), tool_choice(body.tool_choice)
    items = parse_items(await referenced(store, body.input))
    history = await conversation(store, body.previous_response_id)
    check_call_outputs(history, items)
    messages = chat_messages(body.instructions, history + items)
    with responses_params():
        prompt_ids, params, meta = await prepared(engine, chat_request(body, tools, choice, messages))
    storing = store is not None and body.store is not False
    response = Response(
        id=new_id("resp"), created_at=meta.created, status="in_progress", instructions=body.instructions,
        max_output_tokens=body.max_output_tokens, metadata=body.metadata or {}, model=body.model, output=[],
        parallel_tool_calls=body.parallel_tool_calls is not False,
        previous_response_id=body.previous_response_id,
        reasoning=ReasoningEcho(body.reasoning.effort if body.reasoning else None,
                                body.reasoning.summary if body.reasoning else None),
        store=storing, temperature=1.0 if body.temperature is None else body.temperature,
        text=text_echo(body),
        tool_choice=choice, tools=tools, top_p=1.0 if body.top_p is None else body.top_p, user=body.user)
    return ResponsePlan(prompt_ids, params, meta, ResponseEvents(response),
                        [stored_item(item) for item in items] if storing else None)


def text_echo(body: ResponsesRequest) -> TextEcho:
    """The request's `text` as the response echoes it (`{"format": {"type": "text"}}` by default)."""
    options = body.text or TextOptions()
    return TextEcho(options.format or TextFormatText(), options.verbosity)


async def referenced(store: ResponseStore | None, raw: str | list[dict[str, Any]]
                     ) -> str | list[dict[str, Any]]:
    """`input` with each `item_reference` replaced by the stored item it names (the Vercel AI SDK
    sends earlier replies so when they are stored); an id no stored item has is a 400 naming it."""
    if isinstance(raw, str) or all(item.get("type") != "item_reference" for item in raw):
        return raw
    out = []
    for i, item in enumerate(raw):
        if item.get("type") == "item_reference":
            item_id = item.get("id")
            found = await store.item(item_id) if store is not None and isinstance(item_id, str) else None
            if found is None:
                raise InvalidRequest(f"`input[{i}]` refers to the item '{item_id}', which no stored response "
                                     "holds", param=f"input[{i}].id")
            item = found
        out.append(item)
    return out


async def conversation(store: ResponseStore | None, previous_id: str | None) -> list[InputItem]:
    """The items of the stored conversation `previous_id` ends (its inputs and outputs, oldest first)."""
    if previous_id is None:
        return []
    if store is None:
        raise InvalidRequest("`previous_response_id` needs stored responses, and storing is off in this "
                             "daemon's settings (`store_responses`)", param="previous_response_id")
    found = await store.conversation(previous_id)
    if found is None:
        raise InvalidRequest(f"Previous response with id '{previous_id}' not found.",
                             param="previous_response_id", code="previous_response_not_found")
    if not found.complete:
        raise InvalidRequest(f"an earlier response of the conversation '{previous_id}' continues is no "
                             "longer stored (deleted, or past the store's bounds)",
                             param="previous_response_id", code="previous_response_not_found")
    items: list[InputItem] = []
    for record in found.records:
        for part in (record.input_items, record.output_items):
            items += parse_items(msgspec.json.decode(part), "previous_response_id")
    return items


class ResponseChunks:
    """The response's events as its reply is generated (`sse.Chunker`), those of one engine event
    together (one write when streamed); it is stored before its last ones go."""

    stopped = False  # ends only with its streams

    def __init__(self, stream: TokenStream, plan: ResponsePlan, store: ResponseStore | None) -> None:
        self.stream = stream
        self.plan = plan
        self.store = store
        self.parser = plan.meta.parser() if plan.meta.shape.parsed else None

    def opening(self) -> list[StreamEvent]:
        """Nothing: `response.created` comes with the first token's events (`ResponseEvents`)."""
        return []

    def feed(self, index: int, event: TokenEvent) -> list[StreamEvent]:
        """The events of the reply's deltas in one engine event; on its last, the response's end."""
        events, parser = self.plan.events, self.parser
        made = [piece for delta in reply_deltas(parser, event) for piece in events.take(delta)]
        if event.finish_reason is not None:
            reasoning = parser.reasoning_tokens if parser is not None else 0
            cut = event.finish_reason.value == "length"
            made += events.finish(usage(self.plan, self.stream, reasoning), cut)
        return made

    async def closing(self) -> list[StreamEvent]:
        """Store the finished response (its last events wait for this)."""
        await save(self.store, self.plan)
        return []

    def failed(self, error: LlmdError) -> list[StreamEvent]:
        """`response.failed`, with the items so far."""
        return self.plan.events.fail(error)


async def completed(stream: TokenStream, chunks: ResponseChunks) -> None:
    """Run a response that is not streamed to its end (and store it), its events unsent."""
    with stream:
        async for event in stream:
            chunks.feed(0, event)
    await chunks.closing()


def usage(plan: ResponsePlan, stream: TokenStream, reasoning_tokens: int) -> ResponseUsage:
    """The response's token accounting: the prompt (and what the prefix cache held of it), the output."""
    prompt, output = plan.meta.prompt_tokens, stream.completion_tokens
    return ResponseUsage(prompt, InputTokensDetails(stream.cached_tokens), output,
                         OutputTokensDetails(reasoning_tokens), prompt + output)


async def save(store: ResponseStore | None, plan: ResponsePlan) -> None:
    """Store the finished response with its input, unless it is not stored."""
    if store is None or plan.stored_input is None:
        return
    response = plan.events.response
    await store.save(StoredResponse(
        id=response.id, created_at=time.time(), previous_id=response.previous_response_id,
        response=_encoder.encode(response), input_items=_encoder.encode(plan.stored_input),
        output_items=_encoder.encode(response.output)))
