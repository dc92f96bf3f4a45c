"""`pagesim route`: an OpenAI-compatible HTTP router in front of real servers (`pagesim serve`,
vLLM, ...), deciding with the same router objects as the simulated cluster
(pagesim.cluster.routers) from the same kind of state (a LoadBoard: its own outstanding counts,
the backends' /metrics gauges scraped every staleness interval).

    backends.py   a backend's address, health and counters; the /metrics scraper
    prompts.py    a request body -> RoutedRequest (token ids, or text by characters / a tokenizer)
    decisions.py  the decision log (JSON lines): what each choice saw and chose, for replay
    proxy.py      one request forwarded: retried on another backend while nothing was streamed,
                  else failed with a reason; streams passed through chunk by chunk
    app.py        the FastAPI application: /v1/completions, /v1/chat/completions, /v1/models,
                  /health, /metrics

It reuses pagesim.serve's HTTP guard, limits, body parsing and runner (none of which loads torch).
"""
