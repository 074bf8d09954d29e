"""flowrl's zoo: the GRPO-family methods as registered parts. Discovered through the ``flowrl.plugins``
entry-point group, exactly as a third-party package would plug in; the core never imports it."""

from flowrl_zoo import aegpo, dance_grpo, egrpo, flow_grpo  # noqa: F401
from flowrl_zoo import branch_grpo  # noqa: F401
from flowrl_zoo import diffusion_nft  # noqa: F401
from flowrl_zoo import flow_grpo_fast  # noqa: F401
from flowrl_zoo import mix_grpo  # noqa: F401
from flowrl_zoo import tempflow_grpo  # noqa: F401
