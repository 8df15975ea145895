"""The built-in algorithms' config keys (``algorithm.*``), one module per algorithm file, without torch: loading a
config reads them here (``raysim.registry.algorithm_config``), and each algorithm imports its own."""
