"""flowledger adapters.llm layer."""
