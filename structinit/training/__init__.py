"""Training: the recipe, what both trainers share, and the two trainers.

    config.py       TrainConfig (the recipe) and its RandAugment policy string; torch-free
    common.py       what both trainers share: lr schedule, parameter groups, compute dtype and
                    autocast, NonFiniteLossError, the checkpoint format and its resume check
    steps.py        optimizer steps per epoch (both trainers count with it) and in a run;
                    held step counts (data-size study)
    trainer.py      the on-device trainer: every seed of a cell at once (train_models)
    stacked.py      N models of one architecture run as one: batched.py's module, or torch.func.vmap
    batched.py      timm's module with a model axis on its weights (batched matmuls, fused attention)
    gradient_step.py  one step's gradients: the whole batch, or on CPU one chunk per core
    reference.py    the textbook one-model loop the equivalence tests and benchmarks compare with
    streamed.py     the streamed trainer (ImageNet: images decoded by workers)

Nothing is imported here: `structinit.training.config` stays importable without torch.
"""
