"""Optimizers (fused SGD, Adam, AdamW), gradient clipping and learning-rate schedules
(``optim.lr_scheduler``: PyTorch's LambdaLR, StepLR, CosineAnnealingLR, LinearLR,
SequentialLR, and the main job's CosineWithWarmup)."""

from autograd.optim import lr_scheduler
from autograd.optim.adam import Adam
from autograd.optim.adamw import AdamW
from autograd.optim.clip_grad import clip_grad_norm_, clip_grads_with_norm_, get_total_norm
from autograd.optim.lr_scheduler import CosineWithWarmup, cosine_lr
from autograd.optim.optimizer import Optimizer
from autograd.optim.sgd import SGD

__all__ = ["Adam", "AdamW", "CosineWithWarmup", "Optimizer", "SGD", "clip_grad_norm_",
           "clip_grads_with_norm_", "cosine_lr", "get_total_norm", "lr_scheduler"]
