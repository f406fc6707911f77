"""``ragpipe serve``: a read-only search and answer API over the published index.

``app`` (the FastAPI endpoints, limits, token, streaming), ``index`` (the
version served and the switch to a newly published one), ``cache`` (the
semantic cache), ``metrics`` (Prometheus), ``server`` (uvicorn, foreground or
in a thread).
"""
