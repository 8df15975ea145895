"""Byzantine-robust aggregation and attacks: the ``aggregator`` and ``attack`` config sections
(:mod:`raysim.robust.config`), the aggregation rules (:mod:`raysim.robust.aggregators`) and the attacks
(:mod:`raysim.robust.attacks`), as functions of the round's updates; they take part in the round as two stages
(``raysim.stages``): :mod:`raysim.robust.attack_stage` and :mod:`raysim.robust.rule_stage`, on the round's rows
(:mod:`raysim.robust.rows`)."""
