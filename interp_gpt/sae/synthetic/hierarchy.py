"""Hierarchies of features, with sae-lens' semantics (`HierarchyNode`, `hierarchy_modifier`):

* a child fires only when its parent fires: where the parent is 0, the child is set to 0 (or, for a
  parent with `scale_children_by_parent`, the child is multiplied by parent_value / parent_mean);
* a node with `mutually_exclusive_children` keeps at most one active child per sample: where its
  feature is active (or always, for a node without a feature) and several children are, one of them,
  chosen uniformly at random, stays and the others are set to 0;
* a node without a `feature_index` only groups its children (they answer to the nearest ancestor
  that has a feature).

The rules apply level by level from the roots (parent gating, then mutual exclusion of that level's
groups), so a child switched off by exclusion switches its own children off too. The random choices
draw `torch.rand` in sae-lens' order, so a seeded run gives sae-lens' samples exactly.

Example:
    >>> h = Hierarchy.from_children({0: [1, 2]}, mutually_exclusive=[0])   # 1, 2 need 0 and exclude each other
    >>> h.apply(torch.tensor([[0.0, 1.0, 1.0], [1.0, 1.0, 0.0]]))
    tensor([[0., 0., 0.],
            [1., 1., 0.]])
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

__all__ = ["HierarchyNode", "Hierarchy", "HierarchyConfig", "generate_hierarchy"]

_LOSER = -1e9  # the score of an inactive sibling in the exclusion draw (scores are uniform in [0, 1))


class HierarchyNode:
    """One node: its feature (`feature_index`, or None for a node that only groups), its `children`, whether
    they exclude each other, whether they scale with it, and an optional `feature_id` (a name)."""

    def __init__(
        self,
        feature_index: int | None = None,
        children: Sequence[HierarchyNode] | None = None,
        mutually_exclusive_children: bool = False,
        scale_children_by_parent: bool = False,
        feature_id: str | None = None,
    ) -> None:
        if feature_index is not None and (isinstance(feature_index, bool) or not isinstance(feature_index, int)):
            raise TypeError(f"HierarchyNode: feature_index must be an int or None, got {feature_index!r}")
        self.feature_index = feature_index
        self.children: list[HierarchyNode] = list(children or [])
        self.mutually_exclusive_children = bool(mutually_exclusive_children)
        self.scale_children_by_parent = bool(scale_children_by_parent)
        self.feature_id = feature_id
        if self.mutually_exclusive_children and len(self.children) < 2:
            raise ValueError(
                f"HierarchyNode({self._name()}): mutually_exclusive_children needs at least 2 children, "
                f"got {len(self.children)}"
            )

    def _name(self) -> str:
        if self.feature_index is not None:
            return f"feature_index={self.feature_index}"
        return f"id={self.feature_id}" if self.feature_id else "a node without a feature"

    def to_dict(self) -> dict[str, Any]:
        """sae-lens' node dict (hierarchy.json)."""
        return {
            "feature_index": self.feature_index,
            "mutually_exclusive_children": self.mutually_exclusive_children,
            "scale_children_by_parent": self.scale_children_by_parent,
            "feature_id": self.feature_id,
            "children": [c.to_dict() for c in self.children],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HierarchyNode:
        """The node a sae-lens node dict describes (its `feature_id`, or `id` as `HierarchyNode.from_dict` reads)."""
        if not isinstance(d, dict):
            raise TypeError(f"hierarchy node must be a dict, got {type(d).__name__} ({d!r})")
        known = {
            "feature_index",
            "children",
            "mutually_exclusive_children",
            "scale_children_by_parent",
            "feature_id",
            "id",
        }
        if unknown := sorted(set(d) - known):
            raise ValueError(f"hierarchy node {d.get('feature_index')!r}: unknown keys {unknown}")
        return cls(
            d.get("feature_index"),
            [cls.from_dict(c) for c in d.get("children", [])],
            d.get("mutually_exclusive_children", False),
            d.get("scale_children_by_parent", False),
            d.get("feature_id", d.get("id")),
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HierarchyNode):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        flags = "x" if self.mutually_exclusive_children else ""
        flags += "R" if self.scale_children_by_parent else ""
        kids = ", ".join(repr(c) for c in self.children)
        return f"HierarchyNode({self.feature_index}{' ' + flags if flags else ''}{': [' + kids + ']' if kids else ''})"


@dataclass
class _Level:
    features: Tensor  # [k] the features at this depth that have a parent feature
    parents: Tensor  # [k] their parents
    rescale: Tensor  # [k] bool: the parent scales them
    groups: Tensor  # [g] the exclusion groups whose node is at this depth


@dataclass
class _Plan:
    levels: list[_Level]
    siblings: Tensor  # [n_groups, max_siblings] feature indices, -1 padded
    sizes: Tensor  # [n_groups]
    group_parents: Tensor  # [n_groups] the group's parent feature, -1 for a node without one


class Hierarchy:
    """A forest of `HierarchyNode` trees, checked: no cycle, no node with two parents, no feature twice,
    feature indices >= 0 (and below `num_features`, checked by `check_fits` where the count is known).
    The nodes are read once, when the Hierarchy is made: change them before, not after.

    Example:
        >>> h = Hierarchy([HierarchyNode(0, [HierarchyNode(1), HierarchyNode(2)], mutually_exclusive_children=True)])
        >>> h.parent_of()
        {1: 0, 2: 0}
    """

    def __init__(self, roots: HierarchyNode | Sequence[HierarchyNode]) -> None:
        roots = [roots] if isinstance(roots, HierarchyNode) else list(roots)
        for r in roots:
            if not isinstance(r, HierarchyNode):
                raise TypeError(f"hierarchy: roots must be HierarchyNodes, got {type(r).__name__} ({r!r})")
        self.roots = roots
        self._check_structure()
        self._plan = self._build_plan()
        self._on_device: dict[torch.device, _Plan] = {}
        self._top = max(self.feature_indices, default=-1)  # the largest feature index in it

    # -- structure ---------------------------------------------------------
    def _check_structure(self) -> None:
        seen_nodes: dict[int, HierarchyNode] = {}
        seen_features: set[int] = set()

        def visit(node: HierarchyNode, path: list[HierarchyNode]) -> None:
            if any(node is p for p in path):
                cycle = " -> ".join(p._name() for p in path[[id(p) for p in path].index(id(node)) :] + [node])
                raise ValueError(f"hierarchy: a cycle: {cycle} (a node cannot be its own ancestor)")
            if id(node) in seen_nodes:
                raise ValueError(f"hierarchy: the node ({node._name()}) has two parents; a node has at most one")
            seen_nodes[id(node)] = node
            f = node.feature_index
            if f is not None:
                if f < 0:
                    raise ValueError(f"hierarchy: feature_index={f} is out of range: feature indices are >= 0")
                if f in seen_features:
                    raise ValueError(f"hierarchy: feature_index={f} appears twice; a feature has one place in it")
                seen_features.add(f)
            for child in node.children:
                visit(child, path + [node])

        for root in self.roots:
            visit(root, [])

    @classmethod
    def from_children(
        cls,
        children: dict[int, Iterable[int]],
        mutually_exclusive: Iterable[int] = (),
        scale_children: Iterable[int] = (),
    ) -> Hierarchy:
        """A hierarchy from `{parent: [children]}` over feature indices; `mutually_exclusive` and `scale_children`
        name the parents whose children exclude each other / scale with them. A cycle is refused by name.

        Example:
            >>> Hierarchy.from_children({0: [1, 2], 1: [3]}).parent_of()
            {1: 0, 2: 0, 3: 1}
        """
        kids = {int(p): [int(c) for c in cs] for p, cs in children.items()}
        me, sc = set(mutually_exclusive), set(scale_children)
        for name, chosen in (("mutually_exclusive", me), ("scale_children", sc)):
            if missing := sorted(chosen - set(kids)):
                raise ValueError(f"hierarchy: {name} names {missing}, which are not parents in children")
        parent: dict[int, int] = {}
        for p, cs in kids.items():
            for c in cs:
                if c in parent:
                    raise ValueError(f"hierarchy: feature {c} has two parents ({parent[c]} and {p}); at most one")
                parent[c] = p
        for start in kids:  # follow parents upward: a feature met twice closes a cycle
            path = [start]
            while path[-1] in parent:
                if (f := parent[path[-1]]) in path:
                    cycle = path[path.index(f) :] + [f]
                    raise ValueError(f"hierarchy: a cycle: {' -> '.join(map(str, reversed(cycle)))}")
                path.append(f)

        def node(f: int) -> HierarchyNode:
            return HierarchyNode(f, [node(c) for c in kids.get(f, [])], f in me, f in sc)

        return cls([node(r) for r in kids if r not in parent])

    def nodes(self) -> list[HierarchyNode]:
        """Every node, breadth first from the roots."""
        out, todo = [], deque(self.roots)
        while todo:
            n = todo.popleft()
            out.append(n)
            todo.extend(n.children)
        return out

    @property
    def feature_indices(self) -> set[int]:
        """The indices of every feature in the tree (nodes without a feature left out)."""
        return {n.feature_index for n in self.nodes() if n.feature_index is not None}

    def parent_of(self) -> dict[int, int]:
        """{feature: its parent feature} (the nearest ancestor with a feature), for features that have one."""
        return {int(f): int(p) for f, p in zip(self._plan_features(), self._plan_parents(), strict=True) if p >= 0}

    def children_of(self) -> dict[int, list[int]]:
        """{feature: its child features}, for features with children."""
        out: dict[int, list[int]] = {}
        for f, p in self.parent_of().items():
            out.setdefault(p, []).append(f)
        return out

    def _plan_features(self) -> list[int]:
        return [f for lv in self._plan.levels for f in lv.features.tolist()]

    def _plan_parents(self) -> list[int]:
        return [p for lv in self._plan.levels for p in lv.parents.tolist()]

    def check_fits(self, num_features: int, arg: str = "hierarchy") -> None:
        """Refuse, by name, a feature index outside 0..num_features-1."""
        if self._top >= num_features:
            raise ValueError(f"{arg}: feature_index={self._top} is out of range: features are 0..{num_features - 1}")

    @property
    def rescaling_parents(self) -> list[int]:
        """The parent features whose children scale with them."""
        return sorted(
            {p for lv in self._plan.levels for p, r in zip(lv.parents.tolist(), lv.rescale.tolist(), strict=True) if r}
        )

    def to_dict(self) -> dict[str, Any]:
        """sae-lens' hierarchy.json: {"roots": [node dicts]}."""
        return {"roots": [r.to_dict() for r in self.roots]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Hierarchy:
        """The hierarchy sae-lens' hierarchy.json describes (`{"roots": [node dicts]}`)."""
        if not isinstance(d, dict) or not isinstance(d.get("roots"), list):
            raise ValueError(f"hierarchy: expected a dict {{'roots': [...]}}, got {str(d)[:80]}")
        return cls([HierarchyNode.from_dict(r) for r in d["roots"]])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Hierarchy):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Hierarchy({self.roots!r})"

    # -- the rule, level by level ----------------------------------------------
    def _build_plan(self) -> _Plan:
        info: list[tuple[int, int, int, bool]] = []  # (feature, parent feature or -1, depth, parent rescales)
        groups: list[tuple[int, int, list[int]]] = []  # (depth of the node, its feature or -1, child features)
        todo: deque[tuple[HierarchyNode, int, int, bool]] = deque((r, -1, 0, False) for r in self.roots)
        while todo:  # breadth first, as sae-lens orders its groups (the order of the exclusion draws)
            node, parent, depth, rescales = todo.popleft()
            if node.feature_index is not None:
                info.append((node.feature_index, parent, depth, rescales))
                parent = node.feature_index
            kids = [c.feature_index for c in node.children if c.feature_index is not None]
            if node.mutually_exclusive_children and len(kids) >= 2:
                groups.append((depth, -1 if node.feature_index is None else node.feature_index, kids))
            todo.extend((c, parent, depth + 1, node.scale_children_by_parent) for c in node.children)
        n_levels = max([i[2] for i in info] + [g[0] for g in groups], default=-1) + 1
        levels = []
        for depth in range(n_levels):
            rows = [(f, p, r) for f, p, d, r in info if d == depth and p >= 0]
            levels.append(
                _Level(
                    torch.tensor([f for f, _, _ in rows], dtype=torch.long),
                    torch.tensor([p for _, p, _ in rows], dtype=torch.long),
                    torch.tensor([r for _, _, r in rows], dtype=torch.bool),
                    torch.tensor([i for i, g in enumerate(groups) if g[0] == depth], dtype=torch.long),
                )
            )
        width = max((len(g[2]) for g in groups), default=0)
        siblings = torch.full((len(groups), width), -1, dtype=torch.long)
        for i, (_, _, kids) in enumerate(groups):
            siblings[i, : len(kids)] = torch.tensor(kids)
        return _Plan(
            levels,
            siblings,
            torch.tensor([len(g[2]) for g in groups], dtype=torch.long),
            torch.tensor([g[1] for g in groups], dtype=torch.long),
        )

    def _plan_on(self, device: torch.device) -> _Plan:
        if device not in self._on_device:
            p = self._plan
            self._on_device[device] = _Plan(
                [_Level(*(t.to(device) for t in (lv.features, lv.parents, lv.rescale, lv.groups))) for lv in p.levels],
                p.siblings.to(device),
                p.sizes.to(device),
                p.group_parents.to(device),
            )
        return self._on_device[device]

    @torch.no_grad()
    def apply(
        self,
        feature_acts: Float[Tensor, "batch num_features"],
        mean_firing_magnitudes: Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> Float[Tensor, "batch num_features"]:
        """`feature_acts` with the hierarchy's rules applied (a new tensor). `mean_firing_magnitudes` is needed
        only where a parent scales its children; `generator` draws the exclusions (torch's global one if None)."""
        if feature_acts.ndim != 2:
            raise ValueError(f"feature_acts has shape {tuple(feature_acts.shape)}, expected [batch, num_features]")
        self.check_fits(feature_acts.shape[1], arg="feature_acts")
        plan, out = self._plan_on(feature_acts.device), feature_acts.clone()
        for lv in plan.levels:
            if lv.features.numel():
                parent_vals, child_vals = out[:, lv.parents], out[:, lv.features]
                on = parent_vals > 0
                if bool(lv.rescale.any()):
                    if mean_firing_magnitudes is None:
                        raise ValueError("mean_firing_magnitudes: needed where a parent has scale_children_by_parent")
                    scale = torch.where(
                        on, parent_vals / mean_firing_magnitudes[lv.parents], torch.zeros_like(parent_vals)
                    )
                    out[:, lv.features] = child_vals * torch.where(lv.rescale, scale, on.to(child_vals.dtype))
                else:
                    out[:, lv.features] = child_vals * on
            if lv.groups.numel():
                self._exclude(out, lv.groups, plan, generator)
        return out

    @staticmethod
    def _exclude(out: Tensor, groups: Tensor, plan: _Plan, generator: torch.Generator | None) -> None:
        """Keep one random active child per (sample, group) whose parent is active; zero the rest, in place."""
        parents = plan.group_parents[groups]
        has_parent = parents >= 0
        parent_on: Tensor | None = None
        if bool(has_parent.all()):
            parent_on = out[:, parents] > 0  # [batch, groups]
            if not bool(parent_on.any()):
                return  # sae-lens draws nothing here either
        elif bool(has_parent.any()):
            parent_on = (out[:, parents.clamp(min=0)] > 0) | ~has_parent
        sibs = plan.siblings[groups]  # [groups, width]
        width = sibs.shape[1]
        vals = out[:, sibs.clamp(min=0).reshape(-1)].reshape(out.shape[0], len(groups), width)
        active = (vals > 0) & (torch.arange(width, device=out.device) < plan.sizes[groups].unsqueeze(1))
        if parent_on is not None:
            active &= parent_on.unsqueeze(2)
        rows, cols = torch.where(active.sum(dim=2) > 1)  # the (sample, group) pairs with a conflict
        if rows.numel() == 0:
            return
        contenders = active[rows, cols]  # [conflicts, width]
        scores = torch.rand(rows.numel(), width, device=out.device, generator=generator)
        scores[~contenders] = _LOSER
        losers = contenders.clone()
        losers[torch.arange(rows.numel(), device=out.device), scores.argmax(dim=1)] = False
        c, s = torch.where(losers)
        out[rows[c], sibs[cols[c], s]] = 0

    def compute_probability_correction_factors(self, base_probabilities: Tensor) -> Tensor:
        """sae-lens' compensation: factors `[num_features]` that bring each feature's rate back towards its base
        probability once the hierarchy gates it: 1 / p(parent) for a child, times 1 + (sum of its exclusive
        siblings' base probabilities) / p(parent) in an exclusion group; 1 elsewhere."""
        self.check_fits(base_probabilities.shape[0], arg="base_probabilities")
        factors = torch.ones(base_probabilities.shape[0], dtype=base_probabilities.dtype)

        def visit(node: HierarchyNode, parent_p: float) -> None:
            if node.feature_index is not None:
                if parent_p > 0:
                    factors[node.feature_index] = 1.0 / parent_p
                p = base_probabilities[node.feature_index].item()
            else:
                p = parent_p
            for child in node.children:
                visit(child, p)
            kids = [
                (c.feature_index, base_probabilities[c.feature_index].item())
                for c in node.children
                if c.feature_index is not None
            ]
            if node.mutually_exclusive_children and len(kids) >= 2 and p > 0:
                total = sum(q for _, q in kids)
                for f, q in kids:
                    factors[f] *= 1.0 + max(0.0, total - q) / p

        for root in self.roots:
            visit(root, 1.0)
        return factors


@dataclass(frozen=True)
class HierarchyConfig:
    """sae-lens' recipe for a generated forest: `total_root_nodes` trees, `branching_factor` children per parent
    (an int, or (min, max) drawn per parent), `max_depth` levels below the roots; a `mutually_exclusive_portion`
    of the parents with >= 2 children (at depths min..max) get exclusive children; `compensate_probabilities`
    rescales firing probabilities (see `Hierarchy.compute_probability_correction_factors`)."""

    total_root_nodes: int = 100
    branching_factor: int | tuple[int, int] = 100
    max_depth: int = 2
    mutually_exclusive_portion: float = 0.0
    mutually_exclusive_min_depth: int = 0
    mutually_exclusive_max_depth: int | None = None
    compensate_probabilities: bool = False
    scale_children_by_parent: bool = False

    def __post_init__(self) -> None:
        b = self.branching_factor
        if isinstance(b, list):  # JSON has no tuples
            object.__setattr__(self, "branching_factor", b := tuple(b))
        wide_enough = b >= 2 if isinstance(b, int) else len(b) == 2 and 2 <= b[0] <= b[1]
        lo, hi = self.mutually_exclusive_min_depth, self.mutually_exclusive_max_depth
        for name, ok, expected in (
            ("total_root_nodes", self.total_root_nodes > 0, "> 0"),
            ("branching_factor", wide_enough, ">= 2, or (min, max) with 2 <= min <= max"),
            ("max_depth", self.max_depth >= 1, ">= 1"),
            ("mutually_exclusive_portion", 0 <= self.mutually_exclusive_portion <= 1, "in [0, 1]"),
            ("mutually_exclusive_min_depth", lo >= 0, ">= 0"),
            ("mutually_exclusive_max_depth", hi is None or hi >= lo, ">= mutually_exclusive_min_depth"),
        ):
            if not ok:
                raise ValueError(
                    f"HierarchyConfig: {name}={getattr(self, name)!r} is out of range: expected {expected}"
                )

    def to_dict(self) -> dict[str, Any]:
        """sae-lens' JSON for these settings (a `branching_factor` range as a list: JSON has no tuples)."""
        b = self.branching_factor
        return {
            "total_root_nodes": self.total_root_nodes,
            "branching_factor": b if isinstance(b, int) else list(b),
            "max_depth": self.max_depth,
            "mutually_exclusive_portion": self.mutually_exclusive_portion,
            "mutually_exclusive_min_depth": self.mutually_exclusive_min_depth,
            "mutually_exclusive_max_depth": self.mutually_exclusive_max_depth,
            "compensate_probabilities": self.compensate_probabilities,
            "scale_children_by_parent": self.scale_children_by_parent,
        }


def generate_hierarchy(num_features: int, config: HierarchyConfig, seed: int | None = None) -> Hierarchy:
    """sae-lens' generated forest: roots take features 0, 1, ...; then, breadth first, each parent above
    `max_depth` takes the next `branching_factor` features as children, until the features run out; exclusion
    goes to a random `mutually_exclusive_portion` of the eligible parents. Same seed, same forest as sae-lens.

    Example:
        >>> generate_hierarchy(7, HierarchyConfig(total_root_nodes=1, branching_factor=2, max_depth=2)).parent_of()
        {1: 0, 2: 0, 3: 1, 4: 1, 5: 2, 6: 2}
    """
    rng = random.Random(seed)
    counter = iter(range(num_features))  # the next free feature; zip(range(k), counter) takes up to k of them
    roots = [HierarchyNode(f) for _, f in zip(range(config.total_root_nodes), counter, strict=False)]
    parents: list[tuple[HierarchyNode, int]] = [(r, 0) for r in roots]
    level = list(parents)
    while level:
        below: list[tuple[HierarchyNode, int]] = []
        for node, depth in level:
            if depth >= config.max_depth:
                continue
            b = config.branching_factor
            width = b if isinstance(b, int) else rng.randint(b[0], b[1])
            kids = [HierarchyNode(f) for _, f in zip(range(width), counter, strict=False)]
            if depth + 1 < config.max_depth:
                below += [(k, depth + 1) for k in kids]
            node.children = kids
        parents += below
        level = below
    hi = config.mutually_exclusive_max_depth
    eligible = [
        n
        for n, d in parents
        if d >= config.mutually_exclusive_min_depth and (hi is None or d <= hi) and len(n.children) >= 2
    ]
    if (k := int(len(eligible) * config.mutually_exclusive_portion)) > 0:
        for i in rng.sample(range(len(eligible)), k):
            eligible[i].mutually_exclusive_children = True
    if config.scale_children_by_parent:
        for n, _ in parents:
            n.scale_children_by_parent = True
    return Hierarchy(roots)
