"""flowledger projections layer."""
