"""Secure aggregation (issue 53; Bonawitz et al., CCS 2017, and SecAgg+, Bell et al., CCS 2020): fixed-point encoding
into a ring, pairwise and self masks from seeded PRGs, the dropped clients' masks removed through their neighbours,
and the protocol's traffic (:mod:`raysim.secagg.ring`, numpy); the ``secagg`` config section
(:mod:`raysim.sections.secagg`, torch-free); the stage that masks each upload where it trained and unmasks the one sum
on the server (:mod:`raysim.secagg.stage`)."""
