"""Using a policy without training it: held-out sampling and scoring (:mod:`~flowrl.evaluation.evaluate`, used by
``flowrl eval``, the trainer's evaluations and the suites) and the timestep profile (``flowrl profile``)."""
