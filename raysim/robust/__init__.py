"""Byzantine-robust aggregation and attacks (issue 37): the ``aggregator`` and ``attack`` config sections
(:mod:`raysim.robust.config`), the aggregation rules (:mod:`raysim.robust.aggregators`) and the attacks
(:mod:`raysim.robust.attacks`); the driver's round step that joins them is :class:`raysim.robust.step.RobustStep`."""
