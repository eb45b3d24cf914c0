"""The analysts' query process: analyst SQL runs in a Spark application of its own.

Nothing an analyst sends may slow or stop maintenance, ingestion, authentication or health
(docs/analysts.md). So analysts' work never runs in the manager's Spark session, the one that
writes the store: ``pvm serve`` starts a second process (``worker.py``), with its own JVM,
memory cap and threads, that only reads the store's files. The manager keeps it informed of
every view's current files and watermark (the store's records), sends it the REST queries,
row reads and verifications (``warehouse/verify.py``), and restarts it when it dies or stops
answering (``supervisor.py``). Analysts' Spark Connect sessions reach it through the manager's
Connect gateway (``api/connect_gateway.py``), which checks every request against the analyst
role.

* ``messages.py``: the requests and answers between the manager and the process;
* ``worker.py``: the process: a Spark session showing the views (``PublishedViews``), query
  and row execution with job tags, cancellation, result limits, a Connect server on loopback;
* ``verification.py``: a verification's recomputation and comparison, in the process;
* ``supervisor.py``: the manager's side: start, watch, restart, limits, timeouts that end
  the work (cancel, then end the process).
"""
