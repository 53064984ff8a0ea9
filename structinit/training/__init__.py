"""Training: the recipe, what both trainers share, and the two trainers.

    config.py       TrainConfig (the recipe) and its RandAugment policy string; torch-free
    common.py       what both trainers share: lr schedule, parameter groups, the compute dtype
                    (decided once per run) and its autocast, NonFiniteLossError
    checkpoint.py   checkpoints: the fingerprint a resume must match, resuming, the stacked
                    trainer's file and its AdamW state in each model's own layout
    steps.py        optimizer steps per epoch (both trainers count with it) and in a run;
                    held step counts (data-size study)
    trainer.py      the on-device trainer: every seed of a cell at once (train_models), the epoch loop
    step.py         one training step (train_step): forward and loss, backward, clip, AdamW; eager
                    or compiled, the whole batch, micro-batches or on CPU one chunk per core
    batches.py      each model's batches: its order and augmentation, drawn on the device
    evaluation.py   test loss and accuracy, per model of a stack
    memory.py       whether a cell's seeds stack, and the memory estimate that decides it
    stacked.py      N models of one architecture run as one: batched.py's module, or torch.func.vmap
    batched.py      timm's module with a model axis on its weights (batched matmuls, fused attention)
    reference.py    the textbook one-model loop the equivalence tests and benchmarks compare with
    streamed.py     the streamed trainer (ImageNet: images decoded by workers)

Nothing is imported here: `structinit.training.config` stays importable without torch.
"""
