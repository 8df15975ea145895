"""The systems side of a federation (issue 36): each client's compute speed, bandwidths and latency, when it is
available, whether it drops out, and the simulated clock and deadline policies built on them.

- :mod:`raysim.sections.system`: the ``system`` config section (off by default);
- :mod:`raysim.system.model`: :class:`~raysim.system.model.SystemModel`, every client's traits and availability
  computed on demand from (seed, client[, time]), nothing stored per client;
- :mod:`raysim.system.clock`: the synchronous round's policies in simulated time (available clients sampled,
  over-selection, the deadline, late clients dropped or doing partial work);
- :mod:`raysim.system.stage`: those rounds as the run's schedule (``raysim.stages``).
"""
