"""flowledger adapters.cli layer."""
