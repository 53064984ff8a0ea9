from structinit.models.convmixer import FILTER_MODES, create_convmixer, set_spatial_filters
from structinit.models.vit import VIT_T2_CIFAR, create_vit, patch_grid_of, reset_position_encoding, sincos_position_encoding

__all__ = ["VIT_T2_CIFAR", "create_vit", "patch_grid_of", "reset_position_encoding",
           "sincos_position_encoding", "FILTER_MODES", "create_convmixer", "set_spatial_filters"]
