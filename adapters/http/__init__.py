"""HTTP adapter: the seed webhook, the REST API and the dashboard page."""
