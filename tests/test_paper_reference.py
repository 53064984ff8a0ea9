"""The paper's reference (structinit/reporting/paper.py) against the library's defaults.

Reports compare what ran against paper.py explicitly; the library's defaults are meant to be
the same recipe and shape (the README: the library's defaults are the paper's recipe). Training
does not import paper.py, so the two are kept equal here rather than by an import that would
make every quoted number a training dependency.
"""
import dataclasses

from structinit.models.vit import VIT_T2_CIFAR
from structinit.reporting import paper
from structinit.reporting.tables import recipe_departures
from structinit.training.config import TrainConfig


def test_trainconfig_defaults_are_the_papers_small_data_recipe():
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    assert {k: defaults[k] for k in paper.RECIPE} == paper.RECIPE


def test_vit_t2_is_the_papers_shape():
    assert {k: VIT_T2_CIFAR[k] for k in paper.VIT_T2} == paper.VIT_T2


def test_departures_are_named_against_the_recipe_of_the_dataset():
    small = {"train": {**paper.RECIPE, "epochs": 20, "amp": "off", "seed": 3},
             "model": {"patch_size": 1, "embed_dim": 192}}
    # scheduling keys (amp, seed) are not part of the recipe: not departures
    assert recipe_departures(small, "cifar10") == ["epochs 20 (paper 200)", "model patch_size 1 (paper 2)"]
    imagenet = {"train": {**paper.IMAGENET_RECIPE, "warmup_epochs": 5}, "model": dict(paper.VIT_T16)}
    assert recipe_departures(imagenet, "imagenet") == ["warmup_epochs 5 (paper 50)"]
    # the ImageNet command's settings are departures on a 32x32 set
    assert "lr 0.004 (paper 0.001)" in recipe_departures(imagenet, "cifar10")


def test_every_quoted_number_names_a_known_dataset_and_initializer():
    from structinit.init.registry import INITIALIZERS
    from structinit.pipeline.cells import impulse_kernel

    for init, row in paper.MAIN.items():
        assert init in INITIALIZERS or impulse_kernel(init), init
        assert set(row) == set(paper.DATASETS)
    assert set(paper.TRAIN_IMAGES_OF) == set(paper.DATASETS)
