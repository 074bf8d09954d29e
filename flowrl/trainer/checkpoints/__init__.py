"""A run's checkpoints, in one place: what one checkpoint folder holds and how it is found and read
(:mod:`~flowrl.trainer.checkpoints.folder`), when the loop writes them (the periodic ``step_N`` folders,
``best``, the final one: :mod:`~flowrl.trainer.checkpoints.saving`), the iteration-start checkpoint written when a
part fails mid-iteration (:mod:`~flowrl.trainer.checkpoints.restart`), and what a resumed run may change
(:mod:`~flowrl.trainer.checkpoints.resume`)."""
