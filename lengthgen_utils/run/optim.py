"""The optimiser: its settings, and the one function that builds it for every trainer.

Every trainer of the book (:func:`~lengthgen_utils.run.training.train` for the single head,
:func:`~lengthgen_utils.run.training.train_squared_loss` for chapter 6's kernel head,
:func:`~lengthgen_utils.run.training.train_sequence` for the transformer) builds its optimiser with
:func:`build_optimizer` from an :class:`OptimizerSettings`. Three update rules, all elementwise, so
every model of an ensemble receives exactly the update it would receive trained alone:

* ``"adamw"``: Adam with decoupled weight decay (Loshchilov & Hutter 2019), torch's ``AdamW``;
  ``weight_decay=0`` is plain Adam (Kingma & Ba 2015). The book's recipe.
* ``"sgd"``: stochastic gradient descent, torch's ``SGD``; ``momentum=0`` is plain (stochastic)
  gradient descent, ``momentum=0.9`` heavy-ball momentum. Its ``weight_decay`` is decoupled too
  (``w <- w - lr * weight_decay * w`` before the step), so the three rules mean the same by it.
* ``"sign"``: sign descent, ``w <- w - lr * sign(g)`` (signSGD; with ``momentum`` > 0, the sign of an
  exponential average of gradients, Signum: Bernstein et al. 2018). Adam with ``beta2 -> beta1`` and
  ``eps -> 0`` is this rule; its steepest-descent geometry is the l_inf norm's, where plain gradient
  descent's is the l2 norm's.

Weight decay acts on weights, not on LayerNorm scales and biases (:func:`decays`), as in nanoGPT's
``configure_optimizers``: a decayed LayerNorm scale pulls the normalised activations to zero.

Another rule is one function, registered by name (:func:`register_optimizer`): see the recipe
"Change the optimiser" in the book's page "How the package is built" (``architecture.md``).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .._validate import check_positive_float, normalize_numbers

@dataclass(frozen=True)
class Rule:
    """A registered update rule: ``build(groups, settings)`` returns a ``torch.optim.Optimizer`` over the parameter
    groups :func:`build_optimizer` made (each a dict with ``"params"`` and ``"weight_decay"``); ``momentum`` says
    whether the rule reads ``settings.momentum`` (one that does not refuses a non-zero momentum)."""

    build: Callable
    momentum: bool = False


OPTIMIZERS: dict[str, Rule] = {}
"""The update rules by name, filled by :func:`register_optimizer`: ``"adamw"``, ``"sgd"``, ``"sign"``."""


def register_optimizer(name: str, momentum: bool = False):
    """Decorator: make ``build(groups, settings) -> torch.optim.Optimizer`` the update rule called ``name``.

    Raises:
        TypeError / ValueError: ``name`` is not a non-empty str, or is taken already.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str; got {type(name).__name__} {name!r}")
    if name in OPTIMIZERS:
        raise ValueError(f"an optimiser called {name!r} is registered already; taken: {sorted(OPTIMIZERS)}")

    def decorate(build):
        if not callable(build):
            raise TypeError(f"register_optimizer({name!r}) decorates a function; got {build!r}")
        OPTIMIZERS[name] = Rule(build, momentum)
        return build

    return decorate


@dataclass(frozen=True)
class OptimizerSettings:
    """How a trainer updates the weights: the rule's name and its hyper-parameters (hashable).

    Fields:
        name: a registered rule (:data:`OPTIMIZERS`): ``"adamw"``, ``"sgd"``, ``"sign"``, or one added with
            :func:`register_optimizer`.
        lr: learning rate (step size), > 0.
        weight_decay: decoupled weight decay, >= 0 (0: none). Applied only to parameters that
            :func:`decays` names.
        momentum: in [0, 1); ``"sgd"`` heavy-ball momentum, ``"sign"`` the average whose sign is taken.
            Must be 0 for a rule without one, such as ``"adamw"`` (Adam's averages are its ``betas``, torch's
            defaults 0.9, 0.999).

    Raises:
        TypeError / ValueError: a field out of range, an unknown name, or momentum for a rule without one.
    """

    name: str = "adamw"
    lr: float = 1e-2
    weight_decay: float = 0.0
    momentum: float = 0.0

    def __post_init__(self):
        normalize_numbers(self)  # numpy scalars become Python numbers before any check
        if not isinstance(self.name, str):
            raise TypeError(f"optimizer must be a name (str), one of {sorted(OPTIMIZERS)}; got "
                            f"{type(self.name).__name__} {self.name!r}")
        if self.name not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {sorted(OPTIMIZERS)}; got {self.name!r}")
        check_positive_float("lr", self.lr)
        check_positive_float("weight_decay", self.weight_decay, allow_zero=True)
        momentum = check_positive_float("momentum", self.momentum, allow_zero=True)
        if momentum >= 1:
            raise ValueError(f"momentum must be in [0, 1); got momentum={momentum}")
        if momentum and not OPTIMIZERS[self.name].momentum:
            takes = sorted(n for n, rule in OPTIMIZERS.items() if rule.momentum)
            why = " (Adam's averages are its betas, 0.9 and 0.999)" if self.name == "adamw" else ""
            raise ValueError(f"momentum must be 0 for {self.name!r}, which has no momentum setting{why}; "
                             f"got momentum={momentum}: these take one: {takes}")

    def describe(self) -> str:
        """A short label for figures and prose, e.g. ``"Adam, lr 0.01"`` or ``"SGD + momentum 0.9, lr 0.05"``."""
        names = {"adamw": "Adam" if self.weight_decay == 0 else "AdamW", "sgd": "SGD", "sign": "sign descent"}
        label = names.get(self.name, self.name)
        if self.momentum:
            label += f" + momentum {self.momentum:g}"
        label += f", lr {self.lr:g}"
        if self.weight_decay:
            label += f", decay {self.weight_decay:g}"
        return label


def decays(name: str) -> bool:
    """Whether weight decay acts on the parameter called ``name`` (a ``named_parameters`` name).

    Weights decay; LayerNorm scales and biases do not. A parameter is left alone when a component of its
    name starts with ``ln`` (the book's ``ln1_w``, ``ln_f_b``; torch's ``ln1.weight``) or its last
    component is a bias (``bias``, ``b_in``, ``ln2_b``: ``bias``, ``b_*`` or ``*_b``). The single head,
    the kernel head and the recurrent model have neither kind, so every one of their parameters decays.
    """
    parts = name.split(".")
    leaf = parts[-1]
    return not (any(part.startswith("ln") for part in parts) or leaf == "bias" or leaf.startswith("b_")
                or leaf.endswith("_b"))


class SignDescent(torch.optim.Optimizer):
    """Sign descent: ``w <- (1 - lr wd) w - lr sign(m)``, with ``m = g`` (signSGD) or, for ``momentum`` > 0,
    ``m <- momentum m + (1 - momentum) g`` (Signum). Bernstein et al. 2018, "signSGD: compressed
    optimisation for non-convex problems", Algorithms 1 and 3; decay decoupled as in AdamW.
    Elementwise, so ensemble members stay independent. Arguments are checked by :class:`OptimizerSettings`."""

    def __init__(self, params, lr: float, momentum: float = 0.0, weight_decay: float = 0.0):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            lr, beta, wd = group["lr"], group["momentum"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                direction = p.grad
                if beta:
                    buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
                    buf.mul_(beta).add_(p.grad, alpha=1 - beta)
                    direction = buf
                if wd:
                    p.mul_(1 - lr * wd)
                p.add_(direction.sign(), alpha=-lr)


class _DecoupledSGD(torch.optim.SGD):
    """torch's SGD with AdamW-style decoupled weight decay (``w <- (1 - lr wd) w`` before the step, each
    group's ``decoupled_decay``), so that ``weight_decay`` means the same under every rule of :data:`OPTIMIZERS`."""

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            if group["decoupled_decay"]:
                for p in group["params"]:
                    if p.grad is not None:
                        p.mul_(1 - group["lr"] * group["decoupled_decay"])
        return super().step(closure)


def build_optimizer(model: torch.nn.Module, settings: OptimizerSettings, fused: bool = False) -> torch.optim.Optimizer:
    """The optimiser every trainer uses: ``settings``' rule over ``model``'s parameters.

    Parameters :func:`decays` names get ``settings.weight_decay``; the others (LayerNorm scales, biases)
    get none. With no weight decay, one parameter group holds every parameter in ``named_parameters``
    order, so the update is exactly torch's optimiser over ``model.parameters()``.

    Args:
        model: any of the book's models (an ensemble: every parameter has a leading model axis ``M``).
        settings: an :class:`OptimizerSettings`.
        fused: ``"adamw"`` only (else a ``ValueError``): torch's fused kernel (one kernel per parameter instead of about ten; the
            transformer's trainer uses it on CPU and CUDA). It rounds differently from the default path.

    Returns:
        a ``torch.optim.Optimizer``.

    Raises:
        TypeError: ``settings`` is not an :class:`OptimizerSettings`.
        ValueError: ``fused`` with a rule other than ``"adamw"``.
    """
    if not isinstance(settings, OptimizerSettings):
        raise TypeError(f"settings must be an OptimizerSettings; got {type(settings).__name__} {settings!r:.80}")
    named = list(model.named_parameters())
    wd = settings.weight_decay
    if wd == 0 or all(decays(n) for n, _ in named):
        groups = [{"params": [p for _, p in named], "weight_decay": wd}]
    else:
        groups = [{"params": [p for n, p in named if decays(n)], "weight_decay": wd},
                  {"params": [p for n, p in named if not decays(n)], "weight_decay": 0.0}]
    if fused and settings.name != "adamw":
        raise ValueError(f"fused applies to 'adamw' only; got optimizer {settings.name!r}")
    if fused:
        return torch.optim.AdamW(groups, lr=settings.lr, fused=True)
    return OPTIMIZERS[settings.name].build(groups, settings)


@register_optimizer("adamw")
def _adamw(groups, settings):
    return torch.optim.AdamW(groups, lr=settings.lr)


@register_optimizer("sgd", momentum=True)
def _sgd(groups, settings):
    # the decay goes to the rule's own decoupled step, not to torch's SGD (there it is an L2 term in the gradient)
    return _DecoupledSGD([{"params": g["params"], "decoupled_decay": g["weight_decay"]} for g in groups],
                         lr=settings.lr, momentum=settings.momentum)


@register_optimizer("sign", momentum=True)
def _sign(groups, settings):
    return SignDescent(groups, lr=settings.lr, momentum=settings.momentum)
