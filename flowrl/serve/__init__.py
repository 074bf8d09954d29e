"""``flowrl serve``: any reward behind HTTP (:mod:`flowrl.serve.app`), for ``[[reward]] type = "remote"``."""
