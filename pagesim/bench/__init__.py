"""`pagesim bench`: a trace replayed over HTTP against any OpenAI-compatible server (ours, vLLM,
SGLang, TGI ...), measured in the same schema as `pagesim replay` and `pagesim run`.

    prompts.py  the requests' prompts: token ids, or text that tokenizes to the same length
    client.py  the asyncio + aiohttp load generator and its per-request timings
    scrape.py  the server's Prometheus metrics, polled for what a client cannot see
"""
