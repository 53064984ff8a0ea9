"""Training: the recipe and the two trainers.

    config.py       TrainConfig (the recipe) and the optimizer steps it makes; torch-free
    trainer.py      the on-device trainer, read top to bottom: every seed of a cell at once
                    (train_models), the epoch loop, the step with its AdamW and lr schedule, the
                    step as one CUDA graph, the batches drawn on the device, the evaluation
    stacked.py      N models of one architecture run as one (batched layers or torch.func.vmap),
                    the precision a run computes in, and the pieces a step's forward and backward
                    run in: eager or compiled, the whole batch, micro-batches or the CPU's chunks
    checkpoint.py   checkpoints: the fingerprint a resume must match, resuming, the stacked file
    streamed.py     the streamed trainer (ImageNet: images decoded by workers, DDP)

Whether a cell's seeds stack, and the memory estimate that decides it: structinit/memory.py.
Nothing is imported here: `structinit.training.config` stays importable without torch.
"""
