"""A session's parts that do not run the model: the host gate (``host``), the record
(``record``) and the served path's session through mlx_lm.server (``served``). The engine
path's A/B loop, which drives the decode, is ``engine.ab``."""
