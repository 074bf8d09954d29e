"""flowrl's zoo: the GRPO-family methods as registered parts. Discovered through the ``flowrl.plugins``
entry-point group, exactly as a third-party package would plug in; the core never imports it."""

from flowrl_zoo import (  # noqa: F401
    aegpo,
    branch_grpo,
    crd,
    dance_grpo,
    diffusion_dpo,
    diffusion_nft,
    egrpo,
    flash_grpo,
    flow_dppo,
    flow_grpo,
    flow_grpo_fast,
    grpo_guard,
    mix_grpo,
    tempflow_grpo,
)
