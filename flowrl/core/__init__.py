"""The contracts every part and the trainer share, importing nothing else of flowrl: the part interfaces
(:mod:`~flowrl.core.interfaces`) and their contracts (:mod:`~flowrl.core.contracts`), the typed batches between
them (:mod:`~flowrl.core.types`, :mod:`~flowrl.core.extras`, :mod:`~flowrl.core.conditions`), the registries
(:mod:`~flowrl.core.registry`), the sampling grid and noise levels, the random streams, the settings converter
and the base of every error a user must fix (:mod:`~flowrl.core.errors`)."""
