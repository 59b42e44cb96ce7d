"""OpenAI's Responses API: `/v1/responses`, its stream of typed events, its stored conversations."""
