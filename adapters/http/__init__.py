"""flowledger adapters.http layer."""
