"""The one base of every error that means "stop and tell the user what to fix".

A bad recipe, prompt file, checkpoint or run folder, a reward that fails, a run that diverged or trained
nothing: each raises a subclass of :class:`UserError` naming the file and the key. The command line prints
it on one line and exits with status 2; any other exception is an internal error and keeps its traceback.
Library users catch ``UserError`` the same way.
"""


class UserError(Exception):
    """A mistake in the input, or a run condition the user must fix; its message is one line."""


class PartError(UserError):
    """A user-written part (a reward, a selector) failed: raised, exited or returned what its interface does not
    allow. The line names the part; raised ``from`` the part's own exception, whose traceback the command line
    prints above the line (the bug is in the part's code)."""


def part_failure(error: BaseException) -> str:
    """How a user-written part failed, for the line naming it: the exception's type and message, or the exit
    code it gave ``sys.exit``."""
    if isinstance(error, SystemExit):
        return f"called sys.exit({error.code!r})"
    return f"{type(error).__name__}: {error}"
