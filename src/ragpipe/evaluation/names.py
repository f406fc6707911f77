"""The retrieval metrics' names, importable without numpy (the configuration checks
``index.gate.metric`` against them at load)."""

# The deepest rank cutoff of the metrics (recall@10, NDCG@10): a run must rank this many
# (eval.depth, the flows' depth parameter and run_retrieval_eval check it).
DEEPEST_CUTOFF = 10

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
