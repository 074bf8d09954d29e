"""``flowrl report``: a one-page HTML report of a run (:mod:`flowrl.report.page`)."""

from flowrl.core.errors import UserError


class ReportError(UserError):
    """A path that is not a run folder, or an output file that cannot be written: a user error."""
