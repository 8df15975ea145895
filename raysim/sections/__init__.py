"""The config sections of the subsystems, torch-free and free of the subsystems' code: ``privacy``, ``robust``
(``aggregator`` and ``attack``), ``secagg``, ``compression``, ``system`` and ``asynchronous``. A config loads and is
checked from these alone (``raysim.config_sections`` gathers them into the schema), before torch or an optional
library is imported; the subsystems (:mod:`raysim.privacy`, :mod:`raysim.robust`, :mod:`raysim.secagg`,
:mod:`raysim.compression`, :mod:`raysim.system`, :mod:`raysim.engine.asynchronous`) import their section from here,
so nothing below them imports back up into them."""
