"""Datasets: what each is, and its images as tensors on the device.

    specs.py      DatasetSpec per dataset (shape, classes, normalization, split sizes)
    tensors.py    a dataset as one uint8 tensor (download, load, stratified subsets)
    augment.py    batched augmentation on the device (RandAugment, flips)
    imagenet.py   ImageNet-1K streamed from a local folder (timm transforms, seeded per image)

Nothing is imported here: `structinit.data.specs` stays importable without torch.
"""
