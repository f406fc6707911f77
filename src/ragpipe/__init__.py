"""ragpipe: keep a retrieval index fresh and measure RAG quality honestly.

The library never imports Prefect; ``tasks/`` and ``flows/`` wrap it.
"""

__version__ = "0.1.0"
