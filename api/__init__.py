"""HTTP edges: the manager's API and the wrapper's API (FastAPI), auth and metrics."""
