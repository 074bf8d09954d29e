"""BranchGRPO's tree sampler: split steps branch every node into ``factor`` children, ODE elsewhere.

Each prompt starts one tree from one initial noise (the root). The plan's units are the split steps: at a
unit ``(i, m)`` every current node takes ``factor`` SDE jumps ``s_i -> s_{i+m}`` with independent noise, all
from the node's single transformer evaluation at step ``i``; every other step is a deterministic ODE step,
shared by the whole subtree below the node. The leaves are finished by ODE and are the rollouts (scored).
The tree is walked level by level: one batched transformer call per grid step for all nodes of all trees.
"""

from __future__ import annotations

import attrs
import torch
from attrs.validators import ge, gt

from flowrl import Backbone, Plan, Rollout, RolloutSampler, Schedule, Transitions, register
from flowrl.core.contracts import needs, refuses
from flowrl.core.rng import RolloutRNG
from flowrl.parts.samplers.solvers import euler_step
from flowrl.parts.samplers.walk import empty_transitions
from flowrl_zoo.branch_grpo.tree import TREE, Tree


def analytic_nfe(num_steps: int, units: list[tuple[int, int]], factor: int) -> int:
    """Transformer evaluations of one tree: one per distinct (latent, step).

    At an evaluated grid step ``t`` a tree holds ``factor ** k`` latents, ``k`` the number of splits that
    ended by ``t``; steps inside a merged split (``i < t < i + m``) are not evaluated. With 20 steps, factor 2
    and splits at 0, 3, 6, 9: 1 + 2*3 + 4*3 + 8*3 + 16*10 = 203 evaluations for 16 leaves.
    """
    jumps = dict(units)
    total, width, t = 0, 1, 0
    while t < num_steps:
        total += width
        if t in jumps:
            width *= factor
            t += jumps[t]
        else:
            t += 1
    return total


@register("sampler", "branch_tree")
class BranchTreeSampler(RolloutSampler):
    """Tree rollouts (BranchGRPO, arXiv 2509.06040): ``factor`` children per node at each split step (the plan's
    units), ODE between splits, children sharing the parent's evaluation; leaves are the rollouts.

    ``exploration_temperature`` T multiplies the sampling noise of every split, ``x' = mean + T std eps``,
    while the recorded log-density stays the policy's ``N(mean, std^2)``: with T != 1 the samples come from
    another distribution than the one trained (off-policy; the official code uses T = 4 silently). 1.0 = off.
    """

    provides = frozenset({"tree"})
    requires = (
        needs(
            "node_advantages",
            "its transitions are tree edges, each trained with the advantage of the node it reaches; use the"
            " branch_depthwise estimator",
            when="policy_loss",
        ),
        refuses(
            "no_trained_units",
            "the tree splits at the plan's units and trains their edges, and such a plan trains none (without"
            " units every prompt is one rollout); use branch_splits",
        ),
        refuses(
            "unit_every_step",
            "the tree splits at every unit, so it would have factor ** num_steps leaves per prompt (1024 on a"
            " 10-step grid with factor 2); choose the split steps with branch_splits",
        ),
    )

    @attrs.frozen
    class Config:
        factor: int = attrs.field(default=2, validator=ge(2))  # children per node at each split
        exploration_temperature: float = attrs.field(default=1.0, validator=gt(0))  # noise scale T; 1.0 = off
        max_leaves: int = attrs.field(default=4096, validator=ge(1))  # refuse trees wider than this per prompt

    def leaves_per_prompt(self, plan: Plan) -> int:
        """Rollouts per prompt for a plan: ``factor`` to the number of splits."""
        return int(self.config.factor ** len(plan.units))

    def rollout_count(self, plan: Plan, num_prompts: int) -> int:
        """The leaves of every prompt's tree."""
        return num_prompts * self.leaves_per_prompt(plan)

    def rollout(
        self, backbone: Backbone, prompts: list[str], plan: Plan, schedule: Schedule, rng: RolloutRNG
    ) -> Rollout:
        c = self.config
        if plan.group_sizes is not None:
            raise ValueError(
                "branch_tree: the tree fixes the rollouts per prompt; plans with group_sizes are not supported"
            )
        if self.leaves_per_prompt(plan) > c.max_leaves:
            raise ValueError(
                f"branch_tree: {len(plan.units)} splits x factor {c.factor} give {self.leaves_per_prompt(plan)} leaves"
                f" per prompt, above max_leaves = {c.max_leaves}"
            )
        p = len(prompts)
        nfe0 = backbone.nfe
        cond = backbone.encode(prompts)
        x = rng.randn(torch.arange(p), backbone.latent_shape, backbone.device)
        sigmas = schedule.tensor().to(x.device)
        # Current rows (one per node of the deepest level so far), in tree-major order.
        row_prompt, row_node = torch.arange(p), torch.arange(p)
        parent, depth, tree, log_prob = [torch.full((p,), -1)], [torch.zeros(p, dtype=torch.long)], [row_prompt], []
        log_prob.append(torch.zeros(p))
        parts, level, step = [], 0, 0
        while step < schedule.num_steps:
            unit = plan.unit_at(step)
            end = unit.end if unit is not None else step + 1
            n = x.shape[0]
            s, s_next = sigmas[step].expand(n), sigmas[end].expand(n)
            v = backbone.velocity(x, s, cond.take(row_prompt))
            if unit is None:
                x = euler_step(x.float(), v, s, s_next)
                step = end
                continue
            src = torch.arange(n).repeat_interleave(c.factor)
            child_prompt = row_prompt[src]
            noise = rng.randn(child_prompt, x.shape[1:], x.device) * c.exploration_temperature
            dev = src.to(x.device)
            out = schedule.kernel.step(x[dev], v[dev], s[dev], s_next[dev], schedule.s_at_one, noise)
            first = sum(len(d) for d in depth)
            child_node = first + torch.arange(n * c.factor)
            level += 1
            parent.append(row_node[src])
            depth.append(torch.full((n * c.factor,), level, dtype=torch.long))
            tree.append(child_prompt)
            log_prob.append(out.log_prob.float().cpu())
            k = plan.units.index(unit)
            if k in plan.trained:
                parts.append(
                    Transitions(
                        inputs=x,
                        input_s=s,
                        input_cond=row_prompt,
                        input_index=src,
                        s_next=s_next[dev],
                        x_next=out.next,
                        log_prob=out.log_prob,
                        rollout_index=torch.zeros_like(src),  # set below: the first leaf under the child
                        unit_index=torch.full((n * c.factor,), k, dtype=torch.long),
                        weight=torch.ones(n * c.factor),
                        node_index=child_node,
                    )
                )
            x, row_prompt, row_node = out.next, child_prompt, child_node
            step = end
        nodes = Tree(
            parent=torch.cat(parent),
            depth=torch.cat(depth),
            tree=torch.cat(tree),
            log_prob=torch.cat(log_prob),
            leaf=row_node,
        )
        first_leaf = _first_leaf(nodes)
        for part in parts:
            assert part.node_index is not None
            part.rollout_index = first_leaf[part.node_index]
        return Rollout(
            prompts=list(prompts),
            cond=cond,
            images=backbone.decode(x),
            rollout_prompt=row_prompt.clone(),
            group=row_prompt.clone(),
            transitions=Transitions.concat(parts) if parts else empty_transitions(),
            nfe=backbone.nfe - nfe0,
            final_latents=x,
            extras={TREE: nodes},
        )


def _first_leaf(tree: Tree) -> torch.Tensor:
    """For every node, the lowest rollout index among the leaves below it."""
    big = len(tree.leaf)
    first = torch.full((tree.num_nodes,), big, dtype=torch.long)
    node, rollout = tree.leaf.clone(), torch.arange(big)
    while bool((node >= 0).any()):
        live = node >= 0
        first.scatter_reduce_(0, node[live], rollout[live], "amin")
        node = torch.where(live, tree.parent[node.clamp(min=0)], node)
    return first
