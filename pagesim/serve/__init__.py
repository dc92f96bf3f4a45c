"""`pagesim serve`: the executor behind an OpenAI-compatible HTTP API (FastAPI + uvicorn).

    tokenizer.py  text <-> token ids: the model's HF tokenizer, or a byte-level fallback
    engine_loop.py  the one engine thread: add / abort between steps, stream each new token;
                    a failing step fails its requests, an engine that cannot run stops the server
    metrics.py  Prometheus text with vLLM's metric names
    stats_log.py  the periodic engine stats line of the log
    protocol.py  OpenAI request bodies, validation and response / chunk shapes
    generation.py  a request body -> engine request -> samples (prompt ids, sampling checks, stop strings)
    responses.py  whole responses and server-sent event streams
    limits.py, http_guard.py  header / body deadlines, size and connection limits, the API key,
                    the access log
    app.py  the FastAPI application (routes, body parsing, OpenAI-shaped errors)
    runner.py  the listening socket, uvicorn, signals and the exit status

Everything here but limits.py imports torch (through the executor) or uvicorn, so only
`pagesim serve` imports it.
"""
