"""The contract every side depends on: what travels between wrappers and the manager.

- ``schemas``: the wire messages (updates, subqueries and answers, interest) and how values
  travel in them (non-finite floats tagged, bounds on sizes);
- ``expr``: the predicate language of view definitions, its evaluation and its wire form;
- ``zset``: Z-sets, the signed bags that deltas, answers and views all are;
- ``column_types``: the view column types that source column types map to (the store
  declares them);
- ``value_fit``: whether a wire value fits its column's declared type, the one rule by which
  a wrapper leaves a row out of its updates and the manager refuses an update;
- ``file_modes``: files at rest are owner-only, for every process that keeps some;
- ``relation_snapshot`` and ``update_stream``: the Arrow IPC streams of the wire, a
  relation of an initial load and an update batch (the columnar body beside the JSON one).

It imports nothing of the project: ``warehouse`` (the manager) and ``wrappers`` (the sources'
side) stand on it side by side, ``api`` (HTTP) on those, and ``pvm`` (commands, the demo,
benchmarks) on top. The layers are checked by ``lint-imports`` (``[tool.importlinter]`` in
pyproject.toml).
"""
