"""flowledger adapters layer."""
