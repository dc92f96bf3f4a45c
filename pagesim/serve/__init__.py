"""`pagesim serve`: the executor behind an OpenAI-compatible HTTP API (FastAPI + uvicorn).

    tokenizer.py  text <-> token ids: the model's HF tokenizer, or a byte-level fallback
    engine_loop.py  the one engine thread: add / abort between steps, stream each new token
    metrics.py  Prometheus text with vLLM's metric names
    protocol.py  OpenAI request bodies, validation and response / chunk shapes
    app.py  the FastAPI application

Everything here imports torch (through the executor), so only `pagesim serve` imports it.
"""
