"""The ``pvm`` command: service entry points, the demo and the benchmarks."""
