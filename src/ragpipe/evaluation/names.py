"""The retrieval metrics' names, importable without numpy (the configuration checks
``index.gate.metric`` against them at load)."""

METRICS = (
    "recall@5",
    "recall@10",
    "precision@5",
    "mrr",
    "success@5",
    "hit@3",
    "map",
    "ndcg@10",
    "ndcg@10_exp",
)
