"""Thin Prefect task wrappers around ragpipe's stage runners."""
