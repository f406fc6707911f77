"""Ingest: one module per stage, in pipeline order (see STAGES)."""
