"""`pagesim bench`: a trace (or a ShareGPT JSON) replayed over HTTP against any OpenAI-compatible
server (ours, vLLM, SGLang, TGI ...), measured in the same schema as `pagesim replay` and
`pagesim run`; a stand-in for `vllm bench serve`.

    client.py    the asyncio + aiohttp load generator: arrivals, sends, the summary
    stream.py    one streamed answer read and checked (every value the server sends is validated)
    server.py    /v1/models checked: the model, its max_model_len and vocabulary
    context.py   requests past the server's max_model_len: skipped with a reason, or clamped
    scrape.py    the server's Prometheus metrics, polled for what a client cannot see
    prompts.py   the requests' prompts: token ids, or text that tokenizes to the same length
    datasets.py  a ShareGPT JSON as vLLM reads it (a truncated file recovered record by record)
"""
