"""Prefect flows composing ragpipe's tasks, and the ``ragpipe`` CLI."""
