"""A run's checkpoints, in one place: what one checkpoint folder holds and how it is found and read
(:mod:`~flowrl.trainer.checkpoints.folder`), when the loop writes them (the periodic ``step_N`` folders,
``best``, the final one: :mod:`~flowrl.trainer.checkpoints.saving`), the iteration-start checkpoint written when a
part fails mid-iteration (:mod:`~flowrl.trainer.checkpoints.restart`), what a resumed run may change
(:mod:`~flowrl.trainer.checkpoints.resume`), and the manifest that marks a folder ``flowrl export`` wrote, so that
a checkpoint's readers take an export too (:mod:`~flowrl.trainer.checkpoints.manifest`)."""
