"""Stored responses: `GET` and `DELETE /v1/responses/{id}`, `GET /v1/responses/{id}/input_items`.

A stored response is returned as it was stored (the response object of its last event). Its input
items are listed a page at a time, by item id cursors (`after`, `before`), newest first unless
`order=asc`, as OpenAI's list endpoints page.
"""

from __future__ import annotations

from typing import Annotated, Literal

from litestar import Response, delete
from litestar.params import FromPath, FromQuery, QueryParameter

from llmd.api.dependencies import InjectedStore
from llmd.api.routes import get
from llmd.errors import ResponseNotFound, UnsupportedParameter
from llmd.response_object import DeletedResponse, InputItemList

PageLimit = Annotated[int, QueryParameter(ge=1, le=100)]


@get("/v1/responses/{response_id:str}")
async def retrieve_response(response_id: FromPath[str], responses: InjectedStore,
                            stream: FromQuery[bool] = False) -> Response[bytes]:
    """The stored response `response_id`, as it was when it finished."""
    if stream:
        raise UnsupportedParameter("`stream` is not supported: a stored response is returned whole",
                                   param="stream")
    record = await responses.get(response_id) if responses is not None else None
    if record is None:
        raise not_found(response_id)
    return Response(record.response, media_type="application/json")


@delete("/v1/responses/{response_id:str}", status_code=200)
async def delete_response(response_id: FromPath[str], responses: InjectedStore) -> DeletedResponse:
    """Forget the stored response `response_id` (the responses continuing it keep theirs)."""
    if responses is None or not await responses.delete(response_id):
        raise not_found(response_id)
    return DeletedResponse(response_id)


@get("/v1/responses/{response_id:str}/input_items")
async def list_input_items(response_id: FromPath[str], responses: InjectedStore, limit: PageLimit = 20,
                           order: FromQuery[Literal["asc", "desc"]] = "desc",
                           after: FromQuery[str | None] = None, before: FromQuery[str | None] = None,
                           include: FromQuery[list[str] | None] = None) -> InputItemList:
    """One page of the stored response's own input items (`include` names nothing llmd stores)."""
    page = await responses.input_items(response_id, limit=limit, order=order, after=after,
                                                before=before) if responses is not None else None
    if page is None:
        raise not_found(response_id)
    ids = [str(item["id"]) for item in page.items]
    return InputItemList(page.items, ids[0] if ids else None, ids[-1] if ids else None, page.has_more)


def not_found(response_id: str) -> ResponseNotFound:
    """OpenAI's 404 for an id with no stored response."""
    return ResponseNotFound(f"Response with id '{response_id}' not found.", param="response_id")
