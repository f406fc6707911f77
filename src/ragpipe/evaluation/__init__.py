"""Evaluation: golden sets, metrics, retrieval and RAG runs, reports, tuning, the eval forms."""
