"""The HTTP layer: Litestar handlers that parse, call the engine through `engine.client.Engine`, and wrap."""
