"""HTTP edges: the manager's API and the wrapper's API (FastAPI), and their wire schemas."""
