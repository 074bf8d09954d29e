"""The built-in parts every method composes: timestep selectors, rollout samplers (:mod:`~flowrl.parts.samplers`),
transition kernels, advantage estimators, losses and prompt sources, and the transition entropy E-GRPO and AEGPO
read. A method's own parts live in the zoo (``flowrl_zoo.<method>``); the parts here are shared by several methods,
which is why two kernels keep the names of the papers that introduced them: ``flow_grpo_sde`` is also the
kernel of E-GRPO, MixGRPO, TempFlow-GRPO, BranchGRPO, GRPO-Guard, Flow-DPPO, CRD and DiffusionNFT's recipes, and
``dance_grpo_sde`` is AEGPO's too. E-GRPO's ``anchor_branch`` sampler stays beside the others for the same reason:
E-GRPO's granular sampler and TempFlow-GRPO's sampler build on it."""
