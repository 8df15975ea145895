"""Communication compression (issue 53): the encodings (:mod:`raysim.compression.codecs`: top-k, random-k, QSGD,
scaled sign, float16), the ``compression`` config section (:mod:`raysim.sections.compression`, torch-free) and the
stage that applies them to uploads, with error feedback, and to the download (:mod:`raysim.compression.stage`)."""
