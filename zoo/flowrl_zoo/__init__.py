"""flowrl's zoo: the GRPO-family methods as registered parts. Discovered through the ``flowrl.plugins``
entry-point group, exactly as a third-party package would plug in; the core never imports it."""

from flowrl_zoo import (  # noqa: F401
    aegpo,
    branch_grpo,  # noqa: F401
    dance_grpo,
    diffusion_nft,  # noqa: F401
    egrpo,
    flow_grpo,
    flow_grpo_fast,  # noqa: F401
    mix_grpo,  # noqa: F401
    tempflow_grpo,  # noqa: F401
)
