"""The scale-out engine: vLLM behind llmd's `Engine` protocol (issue 18). vLLM itself is imported
lazily, only by the engine, and lives in its own environment; `args` is pure."""
