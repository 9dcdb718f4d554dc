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

**One setting per model.** An ensemble whose models differ in learning rate, weight decay or momentum (one
:class:`OptimizerSettings` per model, one rule) still trains as one batched ensemble: :func:`build_optimizer`
then returns a :class:`PerModelOptimizer`, whose step is the rule's own arithmetic with ``[M]``-shaped
coefficients broadcast over each parameter's leading model axis. It performs torch's operations in torch's
order, each coefficient rounded to float32 as torch rounds its Python scalar, so each model's update is the
one it receives trained alone with its own setting, bit for bit on the CPU
(``tests/test_per_model_optimizer.py``). When every model shares one setting, :func:`build_optimizer`
returns torch's optimiser exactly as for a single :class:`OptimizerSettings`.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .._validate import Normalized, check_positive_float

@dataclass(frozen=True)
class Rule:
    """A registered update rule: ``build(groups, settings)`` returns a ``torch.optim.Optimizer`` over the parameter
    groups :func:`build_optimizer` made (each a dict with ``"params"`` and ``"weight_decay"``); ``momentum`` says
    whether the rule reads ``settings.momentum`` (one that does not refuses a non-zero momentum); ``per_model``, if
    given, is the rule's step with one setting per model (:class:`PerModelOptimizer`)."""

    build: Callable
    momentum: bool = False
    per_model: Callable | None = None


OPTIMIZERS: dict[str, Rule] = {}
"""The update rules by name, filled by :func:`register_optimizer`: ``"adamw"``, ``"sgd"``, ``"sign"``."""


def register_optimizer(name: str, momentum: bool = False, per_model: Callable | None = None):
    """Decorator: make ``build(groups, settings) -> torch.optim.Optimizer`` the update rule called ``name``.

    Args:
        name: the rule's name.
        momentum: whether the rule reads ``settings.momentum``.
        per_model: ``None`` (an ensemble must share one setting) or the rule's step with one setting per model,
            ``per_model(p, grad, state, coef)``: update parameter ``p [M, ...]`` in place from its gradient,
            its state dict and the coefficients ``coef`` of :meth:`PerModelOptimizer.coefficients` (each
            ``[M, 1, ..., 1]``, broadcast over ``p``'s leading model axis).

    Raises:
        TypeError / ValueError: ``name`` is not a non-empty str, or is taken already; ``per_model`` not callable.
    """
    if per_model is not None and not callable(per_model):
        raise TypeError(f"per_model must be None or callable; got {type(per_model).__name__} {per_model!r}")
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str; got {type(name).__name__} {name!r}")
    if name in OPTIMIZERS:
        raise ValueError(f"an optimiser called {name!r} is registered already; taken: {sorted(OPTIMIZERS)}")

    def decorate(build):
        if not callable(build):
            raise TypeError(f"register_optimizer({name!r}) decorates a function; got {build!r}")
        OPTIMIZERS[name] = Rule(build, momentum, per_model)
        return build

    return decorate


@dataclass(frozen=True)
class OptimizerSettings(Normalized):
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


def per_model_settings(settings, n_models: int):
    """``settings`` as :func:`build_optimizer` reads it: one :class:`OptimizerSettings`, or a tuple of one per model.

    Args:
        settings: an :class:`OptimizerSettings` (every model), or a sequence of ``n_models`` of them that
            share one rule (``name``) and may differ in ``lr``, ``weight_decay`` and ``momentum``.
        n_models: the ensemble's size M.

    Returns:
        one :class:`OptimizerSettings` when every model shares it (a sequence of equal settings collapses to
        its one element, so it trains exactly as that setting does), else a tuple of ``n_models``.

    Raises:
        TypeError: ``settings`` is neither an :class:`OptimizerSettings` nor a sequence of them.
        ValueError: a sequence whose length is not ``n_models``, whose members name different rules, or whose
            rule has no per-model step (:func:`register_optimizer`'s ``per_model``).
    """
    if isinstance(settings, OptimizerSettings):
        return settings
    if isinstance(settings, (str, bytes)) or not isinstance(settings, Sequence):
        raise TypeError(f"optimizer must be an OptimizerSettings or a sequence of one per model; got "
                        f"{type(settings).__name__} {settings!r:.80}")
    settings = tuple(settings)
    for i, s in enumerate(settings):
        if not isinstance(s, OptimizerSettings):
            raise TypeError(f"optimizer[{i}] must be an OptimizerSettings; got {type(s).__name__} {s!r:.80}")
    if len(settings) != n_models:
        raise ValueError(f"optimizer must hold one OptimizerSettings per model: {n_models}; got {len(settings)}")
    if len(set(settings)) == 1:
        return settings[0]
    names = sorted({s.name for s in settings})
    if len(names) > 1:
        raise ValueError(f"the models of one ensemble must share one update rule; got optimizers {names}")
    if OPTIMIZERS[names[0]].per_model is None:
        takes = sorted(n for n, rule in OPTIMIZERS.items() if rule.per_model is not None)
        raise ValueError(f"optimizer {names[0]!r} has no per-model step, so its models must share one setting; "
                         f"rules with one: {takes}")
    return settings


def _groups(model, weight_decay):
    """The parameter groups: those :func:`decays` names get ``weight_decay``, the others none (one group when
    no parameter is spared or nothing decays; ``weight_decay`` may be a tensor ``[M]``)."""
    named = list(model.named_parameters())
    nothing = not bool(torch.as_tensor(weight_decay).any())
    if nothing or all(decays(n) for n, _ in named):
        return [{"params": [p for _, p in named], "weight_decay": weight_decay}]
    spared = torch.zeros_like(weight_decay) if isinstance(weight_decay, torch.Tensor) else 0.0
    return [{"params": [p for n, p in named if decays(n)], "weight_decay": weight_decay},
            {"params": [p for n, p in named if not decays(n)], "weight_decay": spared}]


def build_optimizer(model: torch.nn.Module, settings, fused: bool = False) -> torch.optim.Optimizer:
    """The optimiser every trainer uses: ``settings``' rule over ``model``'s parameters.

    Parameters :func:`decays` names get ``settings.weight_decay``; the others (LayerNorm scales, biases)
    get none. With no weight decay, one parameter group holds every parameter in ``named_parameters``
    order, so the update is exactly torch's optimiser over ``model.parameters()``.

    With one setting per model that differ (:func:`per_model_settings`), a :class:`PerModelOptimizer`:
    each model updated exactly as trained alone with its own setting. Equal settings give torch's optimiser.

    Args:
        model: any of the book's models (an ensemble: every parameter has a leading model axis ``M``).
        settings: an :class:`OptimizerSettings`, or a sequence of ``M`` (one per model, one rule).
        fused: ``"adamw"`` only (else a ``ValueError``): torch's fused kernel (one kernel per parameter instead of about ten; the
            transformer's trainer uses it on CPU and CUDA). It rounds differently from the default path.

    Returns:
        a ``torch.optim.Optimizer``.

    Raises:
        TypeError: ``settings`` is not an :class:`OptimizerSettings` or a sequence of them.
        ValueError: ``fused`` with a rule other than ``"adamw"`` or with settings that differ between models;
            a bad per-model sequence (:func:`per_model_settings`).
    """
    if not isinstance(settings, OptimizerSettings):
        settings = per_model_settings(settings, getattr(model, "n_models", 1))
    if not isinstance(settings, OptimizerSettings):
        if fused:
            raise ValueError("fused needs one setting shared by every model; got settings that differ between models")
        wd = torch.tensor([s.weight_decay for s in settings], dtype=torch.float64)
        return PerModelOptimizer(_groups(model, wd), settings)
    groups = _groups(model, settings.weight_decay)
    if fused and settings.name != "adamw":
        raise ValueError(f"fused applies to 'adamw' only; got optimizer {settings.name!r}")
    if fused:
        return _adamw(groups, settings, fused=True)
    return OPTIMIZERS[settings.name].build(groups, settings)


class PerModelOptimizer(torch.optim.Optimizer):
    """One update rule whose learning rate, weight decay and momentum differ between the models of an ensemble.

    Every parameter has a leading model axis ``M``. The coefficients are ``[M]`` tensors viewed as
    ``[M, 1, ..., 1]`` and broadcast over it, and the rule's registered ``per_model`` step
    (:func:`register_optimizer`) does the arithmetic of torch's own step for that rule, operation for
    operation and in the same order, with each coefficient computed in float64 and rounded once to float32,
    as torch rounds a Python scalar. So model ``i`` receives exactly the update it would receive trained alone
    with ``settings[i]`` (bit for bit on the CPU: ``tests/test_per_model_optimizer.py``).

    Built by :func:`build_optimizer` (not directly): ``groups`` as it makes them, each with a float64 ``[M]``
    ``"weight_decay"``; ``settings`` checked by :func:`per_model_settings`.
    """

    def __init__(self, groups, settings: tuple[OptimizerSettings, ...]):
        self.settings = tuple(settings)
        self._rule = OPTIMIZERS[self.settings[0].name].per_model
        lr = torch.tensor([s.lr for s in self.settings], dtype=torch.float64)
        momentum = torch.tensor([s.momentum for s in self.settings], dtype=torch.float64)
        super().__init__(groups, {"lr": lr, "momentum": momentum})
        for group in self.param_groups:
            group["coefficients"] = self.coefficients(group["lr"], group["weight_decay"], group["momentum"])

    @staticmethod
    def coefficients(lr, weight_decay, momentum) -> dict:
        """The per-model coefficients of a step, from float64 ``[M]`` hyper-parameters.

        Returns:
            ``{"lr": lr [M] (float64, for Adam's step size), "neg_lr": -lr, "decay": 1 - lr * weight_decay
            (None when no model decays), "momentum": momentum and "one_minus_momentum": 1 - momentum (both None
            when no model has one)}``, the last four float32 ``[M]``.
        """
        f32 = torch.float32
        return {"lr": lr, "neg_lr": (-lr).to(f32),
                "decay": (1 - lr * weight_decay).to(f32) if bool(weight_decay.any()) else None,
                "momentum": momentum.to(f32) if bool(momentum.any()) else None,
                "one_minus_momentum": (1 - momentum).to(f32) if bool(momentum.any()) else None}

    @torch.no_grad()
    def step(self, closure=None):
        """One update of every parameter that has a gradient; ``closure``, if given, is called first (with
        gradients on) and its loss returned, as torch's optimisers do."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            views = group.setdefault("views", {})  # [M] -> [M, 1, ..., 1] on the parameter's device, made once
            for p in group["params"]:
                if p.grad is None:
                    continue
                where = (p.dim(), p.device)
                if where not in views:
                    shape = (-1,) + (1,) * (p.dim() - 1)
                    views[where] = {k: None if v is None else v.to(p.device).view(shape)
                                    for k, v in group["coefficients"].items()}
                self._rule(p, p.grad, self.state[p], views[where])
        return loss


# The per-model steps: torch's arithmetic for each rule (``torch.optim.adamw``'s single-tensor path, ``SGD``,
# :class:`SignDescent`), with ``[M, 1, ..., 1]`` coefficients in place of its Python scalars. ``add_(x, alpha=a)``
# becomes ``addcmul_(x, a)``: both are one fused multiply-add per element, so they round alike.
ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8
"""torch's ``AdamW`` defaults, which the book's ``"adamw"`` rule uses."""


def _adamw_per_model(p, grad, state, coef):
    """AdamW (Loshchilov & Hutter 2019, Algorithm 2) as ``torch.optim.AdamW`` steps it, per-model lr and decay."""
    if not state:
        state["step"] = 0
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    state["step"] += 1
    (beta1, beta2), step = ADAM_BETAS, state["step"]
    exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
    if coef["decay"] is not None:
        p.mul_(coef["decay"])  # w <- (1 - lr wd) w
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    bias_correction1 = 1 - beta1 ** step
    bias_correction2_sqrt = (1 - beta2 ** step) ** 0.5
    denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(ADAM_EPS)
    neg_step_size = (-(coef["lr"] / bias_correction1)).to(p.dtype)  # [M, 1, ..., 1]: -lr / (1 - beta1^t)
    p.add_(exp_avg.mul(neg_step_size).div_(denom))  # torch's addcdiv_(exp_avg, denom, value=-step_size)


def _sgd_per_model(p, grad, state, coef):
    """(Heavy-ball) SGD with decoupled decay as :class:`_DecoupledSGD` steps it, per-model lr, decay, momentum."""
    if coef["decay"] is not None:
        p.mul_(coef["decay"])
    direction = grad
    if coef["momentum"] is not None:  # a model without momentum: buf = 0 * buf + g = g, its plain step
        buf = state.get("momentum_buffer")
        if buf is None:
            buf = state["momentum_buffer"] = grad.detach().clone()
        else:
            buf.mul_(coef["momentum"]).add_(grad)
        direction = buf
    p.addcmul_(direction, coef["neg_lr"])  # w <- w - lr d


def _sign_per_model(p, grad, state, coef):
    """Sign descent (signSGD, Signum) as :class:`SignDescent` steps it, per-model lr, decay and momentum."""
    direction = grad
    if coef["momentum"] is not None:  # a model without momentum: m = 0 * m + 1 * g = g
        buf = state.setdefault("momentum_buffer", torch.zeros_like(p))
        buf.mul_(coef["momentum"]).addcmul_(grad, coef["one_minus_momentum"])
        direction = buf
    if coef["decay"] is not None:
        p.mul_(coef["decay"])
    p.addcmul_(direction.sign(), coef["neg_lr"])


@register_optimizer("adamw", per_model=_adamw_per_model)
def _adamw(groups, settings, fused: bool = False):
    return torch.optim.AdamW(groups, lr=settings.lr, fused=True if fused else None)


@register_optimizer("sgd", momentum=True, per_model=_sgd_per_model)
def _sgd(groups, settings):
    # the decay goes to the rule's own decoupled step, not to torch's SGD (there it is an L2 term in the gradient)
    return _DecoupledSGD([{"params": g["params"], "decoupled_decay": g["weight_decay"]} for g in groups],
                         lr=settings.lr, momentum=settings.momentum)


@register_optimizer("sign", momentum=True, per_model=_sign_per_model)
def _sign(groups, settings):
    return SignDescent(groups, lr=settings.lr, momentum=settings.momentum)
