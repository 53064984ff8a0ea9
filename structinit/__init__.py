"""structinit: structured initialization of attention for Vision Transformers.

Where things are:
    structinit/init/impulse.py   the structured (impulse) init: targets, pseudo-inputs, Q/K
    structinit/init/solvers.py   the paper's Adam solver and the fast closed-form solver
    structinit/init/             initialize(model, method): every initializer by name
    structinit/models/           create_vit (timm ViT), ConvMixer filter modes
    structinit/attention.py      attention maps and mass on each head's offset
    structinit/data.py           dataset registry (digits, cifar10, cifar100, svhn)
    structinit/train.py          the trainer
"""
from .attention import AttentionMaps, attention_maps
from .data import DATASETS, ImageData, get_spec, prepare_dataset, stratified_subset
from .init import METHODS, ImpulseSolution, InitRecord, initialize, solve_impulse_qk
from .models import FILTER_MODES, VIT_T2, create_convmixer, create_vit
from .train import TrainConfig, default_device, train_model

__all__ = ["AttentionMaps", "attention_maps", "DATASETS", "ImageData", "get_spec",
           "prepare_dataset", "stratified_subset", "METHODS", "ImpulseSolution", "InitRecord",
           "initialize", "solve_impulse_qk", "FILTER_MODES", "VIT_T2", "create_convmixer",
           "create_vit", "TrainConfig", "default_device", "train_model"]
